"""One rank's pipeline stage for one step: receive, compute, send; and the same backwards.

The 1F1B schedule (`mimo.parallel.pipeline.schedule`) only calls `forward(t)` for microbatch t and
`backward()` for the oldest microbatch still in flight. Each stage keeps, per in-flight microbatch,
the tensors it received (fresh leaves that require grad) and the output it produced; backward runs
autograd from the output with the gradient received from downstream, then sends the leaves'
gradients upstream. On the LM's last stage the output is the loss sum times 1/N_global, so every
gradient in every module already carries the per-token scaling (SPEC 3.1) and no other rank needs
N_global for its backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.fsdp import FSDPModule

from mimo.data.batching import rows_per_sample, to_device
from mimo.models.multimodal import MimoModel, MimoOutput, ModalitySubmodules
from mimo.models.out_loss import OutPathLoss
from mimo.models.sample_rows import OUTPUT_LENGTHS
from mimo.parallel.bridge.colocated_pipelined import ColocatedPipelineBridge
from mimo.parallel.bridge.pipelined import PipelineBridge
from mimo.parallel.p2p import Outbox, recv_like, recv_message, send_message, send_payload

RowBridge = PipelineBridge | ColocatedPipelineBridge
"""What carries a modality's rows to the LM's first stage and their gradient back (same methods on both)."""

Autocast = Callable[[], AbstractContextManager]


@dataclass(frozen=True)
class StageLink:
    """This rank's connection to one neighbouring stage of its module: the peer, the group this rank
    sends on and the group it receives on (one group per direction, see mimo.parallel.p2p)."""

    peer: int
    send_group: ProcessGroup
    recv_group: ProcessGroup


def _grad_or_zeros(t: torch.Tensor) -> torch.Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A received activation as a leaf whose gradient backward will fill."""
    return t.requires_grad_() if t.is_floating_point() and t.numel() else t


class _Stage:
    """What LM and encoder stages share: links, the in-flight queue and the backward pass."""

    def __init__(self, prev: StageLink | None, next_: StageLink | None, outbox: Outbox, device: torch.device,
                 autocast: Autocast):
        self.prev, self.next, self.outbox, self.device, self.autocast = prev, next_, outbox, device, autocast
        self.inflight: deque[tuple[list[torch.Tensor], torch.Tensor]] = deque()

    def recv_forward(self) -> list[torch.Tensor]:
        return [_leaf(t) for t in recv_message(self.prev.peer, self.prev.recv_group, self.device)]

    def send_forward(self, tensors: list[torch.Tensor]) -> None:
        send_message(tensors, self.next.peer, self.next.send_group, self.outbox)

    def output_grad(self, out: torch.Tensor) -> torch.Tensor:
        """The gradient of this stage's output `out` from the next stage (same shape and dtype)."""
        return recv_like([torch.empty_like(out)], self.next.peer, self.next.recv_group)[0]

    def run_backward(self, out: torch.Tensor, grad: torch.Tensor | None, empty_too: bool = False) -> None:
        """Autograd from `out` with `grad`; skipped where `out` is empty unless `empty_too` (an FSDP2-sharded
        stage's empty lane, whose backward must still run its units' reduce-scatters)."""
        if out.requires_grad and (out.numel() or empty_too):
            torch.autograd.backward(out, grad)

    def send_input_grad(self, inputs: list[torch.Tensor]) -> None:
        send_payload([_grad_or_zeros(inputs[0])], self.prev.peer, self.prev.send_group, self.outbox)


class LMStage(_Stage):
    """A stage of the language model. The first stage embeds text, takes every modality's rows from its
    bridge and aligns them (then the runtime's `shard_sequence` keeps this rank's positions under CP and SP);
    the last one returns the scaled loss and sums the loss for the log. Under context parallel every
    stage holds this CP rank's positions and the text microbatches come cut (`ContextParallel.shard_batch`).
    Packed rows' `document_ids` (whole, under CP too) travel down with the hidden states and positions, and each
    stage builds its own attention mask from them (`MimoModel.document_attention`).
    The last stage also runs the Out path (`MimoModel.output_losses` on its final states, made whole by
    the runtime's `gather_sequence`) for microbatches with `modality_targets`, and adds `out_loss`'s term to its output.
    `layers`: the keys of the layers this stage runs (one model chunk of an interleaved rank); None: all it holds."""

    def __init__(self, model: MimoModel, first: bool, last: bool, bridges: dict[str, RowBridge],
                 text: list[dict] | None, scale: torch.Tensor, out_loss: OutPathLoss | None = None,
                 layers: list[str] | None = None, **kw):
        super().__init__(**kw)
        self.model, self.first, self.last, self.bridges = model, first, last, bridges
        self.text, self.scale, self.out_loss, self.layers = text, scale, out_loss, layers
        self.loss_sum = torch.zeros((), device=self.device)

    def _objective(self, loss_sum: torch.Tensor, hidden: torch.Tensor, mb: dict) -> torch.Tensor:
        """This microbatch's share of the step's objective: the scaled text loss, plus the Out path's terms from
        its final states where the model has an Out path (zero for a microbatch without targets)."""
        scaled = loss_sum.float() * self.scale
        if not self.out_loss.ids:
            return scaled
        targets = mb.get("modality_targets")
        sums = self.model.output_losses(hidden, mb["input_ids"], targets)[0] if targets else {}
        return scaled + self.out_loss.term(MimoOutput(hidden=hidden, modality_loss_sums=sums))

    def _embed(self, mb: dict) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
        """(the bridges' received leaves, the embedded sequence, what travels with it: positions and, for packed
        rows, the whole rows' `document_ids`)."""
        ids = mb["input_ids"]
        if mb.get("attention_mask") is not None:
            raise ValueError("an explicit attention_mask is not supported by the pipeline schedule; pack rows with "
                             "document_ids (data.packing) or train on a colocated layout")
        model = self.model
        width = model.language_model.cfg.hidden
        counts = {name: (ids == model.special_token_ids[name]).sum(1) for name in self.bridges}
        rows = {name: bridge.recv_forward(counts[name], width, self.device) for name, bridge in self.bridges.items()}
        # The model's own crossing hooks (context parallel's entry: the rows' gradient summed over CP) sit
        # between the received leaves, whose gradient goes back over the bridge, and the alignment.
        crossings = model.runtime.bridges
        entered = {name: crossings[name](r, counts[name]) if name in crossings else r for name, r in rows.items()}
        with self.autocast():
            embeds = model.embed_with_rows(ids, entered)
        if model.runtime.shard_sequence is not None:
            embeds = model.runtime.shard_sequence(embeds)
        pos = mb.get("position_ids")
        if pos is None:
            pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        docs = mb.get("document_ids")
        return list(rows.values()), embeds, [pos] if docs is None else [pos, docs]

    def forward(self, t: int) -> None:
        if self.first:
            inputs, hidden, extra = self._embed(self.text[t])
        else:
            hidden, *extra = self.recv_forward()
            inputs = [hidden]
        pos, *docs = extra  # packed rows' document ids travel with the activations; each stage builds its mask
        attention = self.model.document_attention(docs[0]) if docs else None
        lm = self.model.language_model
        mb = self.text[t] if self.last else {}
        rows = mb.get("loss_rows")  # perf.loss_rows_only: the last layer and the loss on the labelled rows
        with self.autocast():
            out = lm(hidden, pos, mask=attention, output_rows=rows, shard_rows=mb.get("shard_loss_rows"),
                     layers=self.layers)
            if self.last:
                labels, mask = mb["labels"], mb.get("loss_mask")
                if rows is not None:
                    labels = labels.reshape(-1).index_select(0, rows)
                    mask = None if mask is None else mask.reshape(-1).index_select(0, rows)
                loss_sum, _ = self.model.runtime.loss_fn(out, lm, labels, mask)
                out = self._objective(loss_sum, out, mb)
        if self.last:
            self.loss_sum += loss_sum.detach().float()
        else:
            self.send_forward([out, *extra])
        self.inflight.append((inputs, out))

    def backward(self) -> None:
        inputs, out = self.inflight.popleft()
        self.run_backward(out, None if self.last else self.output_grad(out))
        if not self.first:
            self.send_input_grad(inputs)
            return
        for bridge, rows in zip(self.bridges.values(), inputs):
            bridge.send_backward(rows.grad, rows, self.outbox)


class ChunkStages:
    """An interleaved rank's model chunks, each an `LMStage` with its own links and in-flight microbatches
    (chunk k is virtual stage k x pp + rank); `mimo.parallel.pipeline.schedule.run_interleaved` drives it."""

    def __init__(self, chunks: list[LMStage]):
        self.chunks = chunks

    @property
    def loss_sum(self) -> torch.Tensor:
        """The loss summed by the last chunk (zero unless it runs the model's last layers)."""
        return self.chunks[-1].loss_sum

    def forward(self, t: int, chunk: int) -> None:
        self.chunks[chunk].forward(t)

    def backward(self, chunk: int) -> None:
        self.chunks[chunk].backward()


class EncoderStage(_Stage):
    """A stage of one modality's encoder. The first stage reads the encoder's inputs and each sample's
    input count; the count travels down the pipeline with the activations, so the last stage can give
    the bridge each sample's number of rows. A lane with no inputs skips the compute and sends empty
    tensors, so every stage still takes part in every microbatch; but where the modality is FSDP2-sharded
    (pp = 1, so one stage runs the whole encoder) it runs a zero stand-in and its backward (exact zero
    gradients, 0 rows), so that every lane joins every all-gather and reduce-scatter, unless the whole global batch
    holds none of its inputs (no encoder keywords: no lane runs it). An unsplit encoder runs
    through `ModalitySubmodules.encode_project`, the entry FSDP2 gathers the submodule's own weights around."""

    def __init__(self, sub: ModalitySubmodules, encoder: str, first: bool, last: bool,
                 bridge: RowBridge | None, inputs: list[tuple[dict, torch.Tensor]] | None, lm_hidden: int,
                 **kw):
        super().__init__(**kw)
        self.sub, self.encoder_name, self.first, self.last = sub, encoder, first, last
        self.encoder: nn.Module = sub.encoders[encoder]
        self.bridge, self.inputs, self.lm_hidden = bridge, inputs, lm_hidden
        self.split = not (first and last)  # the encoder's layers are cut over several stages
        self.sharded = isinstance(sub, FSDPModule)

    def _compute(self, x: torch.Tensor | dict, counts: torch.Tensor,
                 n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This stage's output for `n` inputs and, on the last stage, each sample's rows: the last stage's output is
        the projected rows `[rows, H]`. A split ViT runs its embedding on the first stage, its layers here, its
        finish on the last (VisionTransformer.forward in parts); an unsplit encoder runs whole."""
        if n == 0 and (not self.sharded or not x):  # no inputs in the whole global batch: no rank runs it
            if self.last:
                return torch.zeros(0, self.lm_hidden, device=self.device), torch.zeros_like(counts)
            return torch.zeros(0, device=self.device), None
        if not self.split:
            y, rows = self.sub.encode_project(self.encoder_name, x)
            return rows, self._per_sample(y, x, counts, n)
        vit = self.encoder
        y = vit.run_layers(vit.embed(x["pixel_values"]) if self.first else x)
        if not self.last:
            return y, None
        y = vit.finish(y)
        return self.sub.project(y.reshape(-1, y.shape[-1])), self._per_sample(y, x, counts, n)

    def _per_sample(self, y: torch.Tensor, x: torch.Tensor | dict, counts: torch.Tensor, n: int) -> torch.Tensor:
        """Rows per sample from the encoder's output `y` for `n` inputs: `[n, s, h]` outputs give s each, else the
        inputs' `output_lengths` or the encoder's `rows_per_input(inputs)` say."""
        if n == 0:
            return torch.zeros_like(counts)
        if y.dim() == 3:
            per_input = torch.full((n,), y.shape[1], dtype=torch.long, device=counts.device)
        elif isinstance(x, dict) and OUTPUT_LENGTHS in x:
            per_input = x[OUTPUT_LENGTHS].long()
        elif isinstance(x, dict) and hasattr(self.encoder, "rows_per_input"):  # projected rows of each input
            per_input = self.encoder.rows_per_input(x).long()
        else:
            raise ValueError(f"encoder '{self.encoder_name}' returned rows without a per-input length; return "
                             f"[n, s, h] or pass '{OUTPUT_LENGTHS}' with its inputs")
        return rows_per_sample(counts, per_input)

    def forward(self, t: int) -> None:
        if self.first:
            x, counts = self.inputs[t]
            n = int(counts.sum())  # read on the host, before the copy: no wait for the device
            x = to_device(x, self.device)
            counts = counts.to(self.device)
            leaves = []
        else:
            x, counts = self.recv_forward()
            n = int(counts.sum())
            leaves = [x]
        with self.autocast():
            y, per_sample = self._compute(x, counts, n)
        if self.last:
            self.bridge.send_forward(y, per_sample, self.outbox)
        else:
            self.send_forward([y, counts])
        self.inflight.append((leaves, y))

    def backward(self) -> None:
        leaves, out = self.inflight.popleft()
        grad = self.bridge.recv_backward(out) if self.last else self.output_grad(out)
        self.run_backward(out, grad, empty_too=self.sharded)
        if not self.first:
            self.send_input_grad(leaves)
