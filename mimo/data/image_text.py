"""Real image-text data for training: WebDataset shards or a JSONL manifest, any tokenizer.

Order: the global batch at a step is the step's slice of epochs of seeded permutations (the demo's
rule), so it depends only on (step, global batch, seed): every layout sees the same batches and the
step alone is the resumable position. Sharding: each rank decodes only the samples its microbatches
use (text for its LM lane, images for its encoder lanes), in DataLoader worker processes that run
ahead of training. Faults: a sample whose image or text is unusable (an unreadable image, malformed
text, a placeholder count the image does not give, an id outside the LM's vocabulary) stays in the
batch as an empty row that carries no loss; every rank that reads data agrees on which rows those are
(one small all-reduce per step, the step's first collective), and every such sample is counted and
reported, never a crash or a hang. A sample that fails in an unexpected way (a tokenizer's or
decoder's own error) stops every rank at that same all-reduce, with the error on the rank that met it.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from itertools import count
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from mimo.config.schema import Config
from mimo.data.batching import COUNTS, to_device
from mimo.data.chat import CHAT, special_ids
from mimo.data.media import MediaSpec, media_specs
from mimo.data.samples import BadSample, BatchFailed, Record, encode_text
from mimo.data.seeded_batches import SeededBatches
from mimo.data.tokenizer import ByteTokenizer, load_tokenizer, with_extra_tokens
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel
from mimo.models.step_hints import forward_args

Item = tuple[int, list[int] | None, list[int] | None, dict[str, np.ndarray], str, float]
"""(row, ids, labels, inputs, problem, verdict): ids/labels where the rank needs the text, inputs (modality ->
decoded image or clip) where it needs them; problem "" and verdict USABLE when the sample is usable."""

USABLE, SKIP, FAIL = 0.0, 1.0, 2.0
"""Verdicts on a row, agreed as their maximum over the ranks that read data: use the sample, skip it
(counted), or stop the run on every rank."""

IMAGE_TEXT_SETS = ("webdataset", "jsonl")
"""The data.name values this module serves."""

RecordReader = Callable[..., tuple[list[Record], list[str]]]
"""`(path, field="data.path") -> (records, problems)`: how a real data set reads data.path and data.eval_path
(mimo.data.webdataset.read_webdataset, or mimo.data.jsonl.read_manifest with data.image_root)."""

WORKER_TIMEOUT_S = 300
"""A DataLoader worker silent this long is an error (raised), not a hang."""


class _Samples(Dataset):
    """Decodes one (row, index, want_text, wanted modalities) request; runs in DataLoader workers."""

    def __init__(self, data: ImageTextData):
        self.records, self.tok, self.media = data.records, data.tok, data.media
        self.seq_len, self.vocab, self.prompt_format = data.seq_len, data.vocab, data.prompt_format

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, request: tuple[int, int, bool, frozenset[str]]) -> Item:
        """Every rank that reads a row encodes and checks its text and that the sample has each input, whether
        or not it keeps them, so that the verdict does not depend on which rank decodes which input."""
        row, index, want_text, wanted = request
        rec = self.records[index]
        media = [] if rec.text_only else self.media  # a text-only sample: no placeholders, no inputs
        try:
            ids, labels = encode_text(rec, self.tok, 0, 0, self.seq_len,
                                      [m.token_id for m in media for _ in range(m.tokens)], self.prompt_format)
            self._check_ids(ids, media)
            for m in media:
                if (rec.image if m.kind == "vision" else rec.audio) is None:
                    raise BadSample("no image" if m.kind == "vision" else "no audio")
            inputs = {m.name: m.decode(rec) for m in media if m.name in wanted}
        except BadSample as e:
            return row, None, None, {}, f"sample '{rec.key}': {e}", SKIP
        except Exception as e:  # any other error must reach every rank, not only this one
            return row, None, None, {}, f"sample '{rec.key}' failed to load: {e!r}\n{traceback.format_exc()}", FAIL
        return row, ids if want_text else None, labels if want_text else None, inputs, "", USABLE

    def _check_ids(self, ids: list[int], media: list[MediaSpec]) -> None:
        """One sample's ids against what `mimo.data.checks.check_batch` holds a batch to: as many placeholders
        as each of its inputs (`media`: none for a text-only sample) gives rows, every other id inside the LM's
        vocabulary. Raises BadSample."""
        for m in self.media:
            placeholders, rows = ids.count(m.token_id), m.tokens if m in media else 0
            if placeholders != rows:
                raise BadSample(f"its text holds {placeholders} placeholder ids ({m.token_id}) where the {m.name} "
                                f"input gives {rows} rows; the text must not produce the placeholder id")
        marks = {m.token_id for m in self.media}
        outside = [i for i in ids if i not in marks and not 0 <= i < self.vocab] if self.vocab else []
        if outside:
            raise BadSample(f"token id {outside[0]} lies outside the LM's vocabulary [0, {self.vocab})")


class _StepRequests(Sampler):
    """From `start` on, forever: the list of requests of each step (this rank's rows only)."""

    def __init__(self, data: ImageTextData, start: int, global_batch: int, seed: int):
        self.data, self.start, self.global_batch, self.seed = data, start, global_batch, seed

    def __iter__(self) -> Iterator[list[tuple[int, int, bool, frozenset[str]]]]:
        for step in count(self.start):
            yield self.data.requests(self.data.global_batch_indices(step, self.global_batch, self.seed))


def _own_session(worker_id: int) -> None:
    """Workers leave the trainer's process group: a SIGTERM to the whole group (a scheduler, torchrun)
    must reach only the trainer, which saves a checkpoint and then stops them as usual."""
    os.setsid()


def _agree_max(flags: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags


class ImageTextData(SeededBatches):
    """A set of image/audio-text records with the trainer's data interface (`global_batch(step, size, seed)`).
    `media` lists the inputs of every sample (by default one image of `image_size` giving `image_tokens`
    placeholders of `image_token_id`, for modality `modality`). `reader` decodes one request in the workers."""

    reader: type = _Samples

    def __init__(self, records: list[Record], tokenizer: Any, image_size: int, image_tokens: int, image_token_id: int,
                 seq_len: int, modality: str = "images", workers: int = 0,
                 source_problems: list[str] | None = None, agree: Callable[[torch.Tensor], torch.Tensor] = _agree_max,
                 vocab: int | None = None, media: list[MediaSpec] | None = None, prompt_format: str = CHAT):
        if not records:
            raise ValueError("the data set holds no samples; check data.path")
        self.media = media or [MediaSpec(modality, "vision", image_token_id, image_tokens, image_size=image_size)]
        placeholders = sum(m.tokens for m in self.media)
        if seq_len < placeholders + 3:
            raise ValueError(f"data.seq_len ({seq_len}) must exceed the inputs' {placeholders} tokens + 2; raise it")
        self.records = self.train = records
        self.tok, self.seq_len, self.workers, self.agree, self.vocab = tokenizer, seq_len, workers, agree, vocab
        self.prompt_format = prompt_format  # data.prompt_format: how chats become tokens (mimo.data.chat)
        self.pad = special_ids(tokenizer)[2]
        self.text_rows: set[int] | None = None
        self.input_rows: dict[str, set[int]] | None = None
        self.held_out: ImageTextData | None = None  # data.eval_path's samples, for periodic evaluation
        self.skipped = 0
        self.bad_samples: set[int] = set()
        self.source_problems = list(source_problems or [])
        self._iter: Iterator[list[Item]] | None = None
        self._next_step = -1
        self._reported = 0
        if not dist.is_initialized() or dist.get_rank() == 0:
            for p in self.source_problems:
                print(f"mimo: data: {p}", file=sys.stderr)

    # Sharding --------------------------------------------------------------------------------------
    def shard_for(self, split: Callable[[dict], list[dict]], global_batch: int,
                  agree: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Decode only the rows this rank's microbatches use (in held-out batches too). `split` is the
        trainer's global batch -> local microbatches function; it is run once on a batch of row numbers to
        see which rows arrive. `agree` replaces the verdicts' MAX all-reduce (over the ranks that read data)."""
        rows = torch.arange(global_batch)
        column = rows[:, None].expand(-1, self.seq_len)  # whole rows: context parallel cuts them as it cuts a batch's
        probe = {"input_ids": column, "labels": column, "position_ids": column,
                 "modality_inputs": {m.name: {m.encoder: {m.key: rows}} for m in self.media}}
        micro = split(probe)
        self.text_rows = {int(r) for mb in micro for r in mb.get("input_ids", rows[:0]).reshape(-1)}
        self.input_rows = {m.name: {int(r) for mb in micro for r in mb.get("modality_inputs", {}).get(m.name, {})
                                    .get(m.encoder, {}).get(m.key, rows[:0])} for m in self.media}
        self._iter = None
        if agree is not None:
            self.agree = agree
        if self.held_out is not None:
            self.held_out.text_rows, self.held_out.input_rows = self.text_rows, self.input_rows
            self.held_out.agree = self.agree

    @property
    def image_rows(self) -> set[int] | None:
        """The rows whose first input (the image, on an image-text set) this rank decodes; None unsharded."""
        return None if self.input_rows is None else self.input_rows[self.media[0].name]

    def requests(self, indices: Any) -> list[tuple[int, int, bool, frozenset[str]]]:
        """(row, sample index, want text, modalities to decode) for each row of `indices` this rank reads."""
        text, inputs = self.text_rows, self.input_rows
        out = []
        for row, i in enumerate(indices):
            wanted = frozenset(m.name for m in self.media if inputs is None or row in inputs[m.name])
            if text is None or row in text or wanted:
                out.append((row, int(i), text is None or row in text, wanted))
        return out

    # Batches ----------------------------------------------------------------------------------------
    def _items(self, step: int, global_batch: int, seed: int) -> list[Item]:
        if self._iter is None or step != self._next_step:
            loader = DataLoader(self.reader(self), batch_sampler=_StepRequests(self, step, global_batch, seed),
                                num_workers=self.workers, collate_fn=list, worker_init_fn=_own_session,
                                timeout=WORKER_TIMEOUT_S if self.workers else 0)
            self._iter = iter(loader)
        self._next_step = step + 1
        return next(self._iter)

    def global_batch(self, step: int, global_batch: int, seed: int) -> dict:
        """The global batch at `step` (rows this rank does not use are padding). Collective through
        `agree` (every rank that reads data calls it at every step, before any other collective of the
        step): unusable rows are agreed and counted; a sample that failed unexpectedly on any rank raises
        BatchFailed on all of them."""
        items = self._items(step, global_batch, seed)
        indices = self.global_batch_indices(step, global_batch, seed)
        return self._agreed_batch(items, indices, global_batch, f"step {step}")

    def held_out_batches(self, global_batch: int) -> int:
        """How many global batches data.eval_path's samples fill (0 without it; the last may be partly empty)."""
        return 0 if self.held_out is None else -(-len(self.held_out.records) // global_batch)

    def held_out_batch(self, index: int, global_batch: int) -> dict:
        """Global batch `index` of the held-out samples in order (rows past the last sample are empty and
        carry no loss). Collective through `agree`, like `global_batch`; skips count in the held-out report."""
        ev = self.held_out
        indices = list(range(index * global_batch, min((index + 1) * global_batch, len(ev.records))))
        reader = ev.reader(ev)
        items = [reader[request] for request in ev.requests(indices)]
        return ev._agreed_batch(items, indices, global_batch, f"held-out batch {index}")

    def _agreed_batch(self, items: list[Item], indices: Any, n: int, where: str) -> dict:
        """The batch of `n` rows from this rank's decoded `items`, after the verdicts are agreed (collective
        through `agree`); agreed unusable rows are counted."""
        verdict = torch.zeros(n)
        for row, _, _, _, problem, level in items:
            verdict[row] = level
            if level == SKIP:
                self._report(problem)
        verdict = self.agree(verdict)
        if (verdict == FAIL).any():
            raise BatchFailed(self._failure(items, where, verdict))
        bad = verdict > USABLE
        batch = self._assemble(items, n, bad, indices)
        for row in torch.nonzero(bad).reshape(-1).tolist():
            self.skipped += 1
            self.bad_samples.add(int(indices[row]))
        return batch

    @staticmethod
    def _failure(items: list[Item], where: str, verdict: torch.Tensor) -> str:
        """The message of a failed step: this rank's own error, or where to find it."""
        mine = [problem for *_, problem, level in items if level == FAIL]
        if mine:
            return f"data: {mine[0]}"
        rows = torch.nonzero(verdict == FAIL).reshape(-1).tolist()
        return (f"data: row(s) {rows} of the global batch of {where} failed to load on another rank; "
                "its error names the sample and the cause")

    def _assemble(self, items: list[Item], n: int, bad: torch.Tensor, indices: Sequence[int] | None = None) -> dict:
        """The batch of `n` rows from this rank's `items`; `indices` are the rows' samples (None: row r holds sample
        r; rows past them are empty). A row holds one input of each modality (`modality_counts` 1) and its
        placeholders, even where this rank reads nothing of it or the sample is skipped (zeros then), except a
        usable text-only sample's row: none (0). Every rank knows which rows those are from the records alone."""
        s = self.seq_len
        samples = range(n) if indices is None else indices
        text_only = torch.zeros(n, dtype=torch.bool)
        text_only[: len(samples)] = torch.tensor([self.records[int(i)].text_only for i in samples], dtype=torch.bool)
        counts = (~text_only | bad).long()
        ids = torch.full((n, s), self.pad, dtype=torch.long)
        at = 0
        for m in self.media:  # rows left empty keep their placeholders, so every input still fills its rows
            ids[counts.bool(), at : at + m.tokens] = m.token_id
            at += m.tokens
        labels = torch.full((n, s), IGNORE_INDEX, dtype=torch.long)
        values = {m.name: m.empty(n) for m in self.media}
        for row, row_ids, row_labels, row_inputs, _, _ in items:
            if bad[row]:
                continue
            if row_ids is not None:
                ids[row] = self.pad
                ids[row, : len(row_ids)] = torch.tensor(row_ids)
                labels[row, : len(row_labels)] = torch.tensor(row_labels)
            for name, value in row_inputs.items():
                values[name][row] = torch.from_numpy(value)
        return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(s).expand(n, s).contiguous(),
                "modality_inputs": {m.name: {m.encoder: m.inputs(values[m.name][counts.bool()])} for m in self.media},
                COUNTS: {m.name: counts.clone() for m in self.media}}

    def _report(self, problem: str) -> None:
        self._reported += 1
        if self._reported <= 10:
            print(f"mimo: data: skipped {problem}", file=sys.stderr)
        elif self._reported == 11:
            print("mimo: data: more samples skipped; the count is in summary.json", file=sys.stderr)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: str | torch.device = "cpu", samples: int = 64,
                 batch_size: int = 16) -> dict:
        """Per-token loss of a whole model on the first `samples` usable held-out samples (data.eval_path's;
        without it, the first training samples), in one process, no collective; plus the data reports."""
        src = self.held_out if self.held_out is not None else self
        was_training = model.training
        model.eval()
        total, tokens, used = 0.0, 0, 0
        for lo in range(0, min(samples, len(src.records)), batch_size):
            rows = list(range(lo, min(lo + batch_size, samples, len(src.records))))
            reader = src.reader(src)
            items = [reader[(r - lo, r, True, frozenset(m.name for m in src.media))] for r in rows]
            bad = torch.tensor([it[5] != USABLE for it in items])
            batch = src._assemble(items, len(rows), bad, rows)
            batch = to_device(batch, torch.device(device))
            out = model(**forward_args({k: v for k, v in batch.items() if k != COUNTS}))
            total += float(out.loss_sum)
            tokens += int((batch["labels"] != IGNORE_INDEX).sum())
            used += int((bad == 0).sum())
        model.train(was_training)
        held_out = {} if self.held_out is None else {"held_out_data": self.held_out.report()}
        return {"loss": total / max(tokens, 1), "eval_samples": used, "data": self.report(), **held_out}

    # Resumable counters --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "bad_samples": sorted(self.bad_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.bad_samples = {int(i) for i in state.get("bad_samples", [])}

    def report(self) -> dict:
        """What summary.json says about the data: samples, those that name no input (they train as text alone),
        skips (occurrences), distinct bad samples."""
        text_only = sum(r.text_only and not r.problem for r in self.records)
        return {"samples": len(self.records), "text_only_samples": text_only,
                "skipped_rows": self.skipped, "corrupt_samples": len(self.bad_samples),
                "source_problems": self.source_problems}


def load_tokenizer_spec(spec: str, extra_tokens: dict[str, int] | None = None) -> Any:
    """`byte` = the built-in byte tokenizer; anything else is a local Hugging Face tokenizer directory, with
    model.llm.extra_tokens (`extra_tokens`, {token: id}) added at their ids."""
    if spec == "byte":
        return ByteTokenizer()
    return with_extra_tokens(load_tokenizer(spec), extra_tokens or {}, f"data.tokenizer '{spec}'")


def build_image_text_data(cfg: Config, model: MimoModel, reader: RecordReader, data_class: type = ImageTextData,
                          media: list | None = None) -> ImageTextData:
    """The data set for data.name = "webdataset" or "jsonl", its records read by `reader` (the registry in
    mimo.tasks says which): one vision modality, one audio modality, or one of each (every sample then holds an
    image and a clip); or `data_class` over `media` (native resolution: mimo.data.native_data)."""
    media = media or media_specs(cfg, model)
    tokenizer = load_tokenizer_spec(cfg.data.tokenizer, cfg.model.llm.extra_token_ids)

    def data_set(records: list[Record], problems: list[str], workers: int) -> ImageTextData:
        return data_class(records, tokenizer, 0, 0, 0, cfg.data.seq_len, workers=workers, source_problems=problems,
                          vocab=cfg.model.llm.vocab, media=media, prompt_format=cfg.data.prompt_format)

    data = data_set(*reader(cfg.data.path), cfg.data.workers)
    if cfg.data.eval_path:
        records, problems = reader(cfg.data.eval_path, "data.eval_path")
        data.held_out = data_set(records[: cfg.data.eval_samples], problems, 0)
    return data
