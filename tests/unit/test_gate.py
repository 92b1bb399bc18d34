"""The validation gate: every bad config of [Hardening] item 7 is refused by `mimo train`'s entry with a
`mimo: error:` that names the field and the fix, before anything runs or is written; layouts that passed the
old checks and failed at the first batch or at build are refused by `check_layout`."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from mimo.cli import main
from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.train.gate import check_layout, check_tokenizer, validate_run
from tests.support.configs import T2I, TINY_T2I
from tests.support.hf_helpers import tiny_causal_lm
from tests.support.layout_error import layout_error
from tests.support.tiny_run import DEMO, TINY, tiny_config, train_losses

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
WORDS = ["<unk>", "<s>", "</s>", "<image>", "USER", "ASSISTANT", "user", "assistant", ":", "what", "is", "this", "?"]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """A saved 13-id word-level Hugging Face tokenizer ("what" is id 9)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(folder)
    return folder


def corrupt_copy(source: Path, folder: Path) -> Path:
    folder.mkdir()
    for f in source.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    return folder


def train_refusal(capsys, tmp_path: Path, *overrides: str) -> str:
    """`mimo train` on the tiny demo with `overrides`: asserts exit code 2 and an empty run folder; its stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(DEMO), *TINY, f"--run.out_dir={tmp_path / 'runs'}", *overrides])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert not (tmp_path / "runs").exists()
    return err


def real_data(tokenizer: Path | str, *more: str) -> list[str]:
    return ["--data.name=jsonl", "--data.path=unused.jsonl", f"--data.tokenizer={tokenizer}", *more]


LLAMA3_SCALING = "factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 64"

ITEM_7 = {  # case -> (overrides, what the message must say: the field, then the fix)
    "modality named language": (["--model.modalities.language.token_id=260"],
                                r"model.modalities.language: 'language' is the language model's name.*rename"),
    "llm.layers = 0": (["--model.llm.layers=0"], r"model.llm.layers = 0 must be >= 1"),
    "train.steps = -5": (["--train.steps=-5"], r"train.steps = -5 must be >= 1"),
    "hidden = -128": (["--model.llm.hidden=-128"], r"model.llm.hidden = -128 must be >= 1"),
    "global_batch = 0": (["--data.global_batch=0"], r"data.global_batch = 0 must be >= 1"),
    "optim.lr = -1": (["--optim.lr=-1"], r"optim.lr = -1.0 must be >= 0"),
    "data.workers = -1": (["--data.workers=-1"], r"data.workers = -1 must be >= 0"),
    "logit softcap with the chunked loss on one process": (
        ["--model.llm.logit_softcap=30.0", "--perf.chunked_loss=true"],
        r"model.llm.logit_softcap = 30.0 \(Gemma 2\) caps the logits.*set perf.chunked_loss = false"),
    "rope_scaling missing keys": (["--model.llm.rope_scaling={factor = 8.0}"],
                                  r"model.llm.rope_scaling has the keys \['factor'\]; Llama 3's RoPE scaling takes "
                                  r"exactly factor, low_freq_factor, high_freq_factor, original_max_position_emb"),
    "rope_scaling low >= high": ([f"--model.llm.rope_scaling={{{LLAMA3_SCALING.replace('1.0', '4.0')}}}"],
                                 r"model.llm.rope_scaling = .* needs factor > 0, 0 < low_freq_factor < high_freq"),
    "anyres tile limit without pinpoints": (["--model.modalities.images.anyres_max_tiles=4"],
                                            r"model.modalities.images.anyres_max_tiles \(4\) is OneVision's "
                                            r"anyres_max_N: >= 0, and > 0 only with .*anyres_grid_pinpoints set"),
    "anyres pinpoint not a pair": (["--model.modalities.images.anyres_grid_pinpoints=[[32]]"],
                                   r"model.modalities.images.anyres_grid_pinpoints tiles a kind = 'vision' "
                                   r"modality's images at \[height, width\] pairs.*got \[\[32\]\]"),
    "byte 97 as placeholder": (["--model.modalities.images.token_id=97"],
                               r"model.modalities.images.token_id \(97\) is an id the byte tokenizer writes for text.*"
                               r"use an id it never writes"),
}


@pytest.mark.parametrize("case", ITEM_7)
def test_bad_config_is_refused_by_mimo_train(case, capsys, tmp_path):
    overrides, message = ITEM_7[case]
    err = train_refusal(capsys, tmp_path, *overrides)
    assert err.startswith("mimo: error: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err


def test_llama3_rope_scaling_passes_the_gate_and_trains(tmp_path):
    """Its RoPE against transformers' is tests/unit/test_hf_lm.py's; here the config's keys reach the model."""
    scaling = f"--model.llm.rope_scaling={{{LLAMA3_SCALING}}}"
    validate_run(tiny_config(tmp_path, scaling), 1)
    losses = train_losses(tmp_path, scaling, "--train.steps=2")
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("case, overrides, message", [
    ("corrupt tokenizer.json", ["corrupt"], r"data.tokenizer = '.*corrupt' cannot be read as a Hugging Face tokenizer "
                                            r"\(.*\); replace its tokenizer.json"),
    ("empty tokenizer folder", ["empty"], r"data.tokenizer = '.*empty' holds no tokenizer files; save one there"),
    ("a real token as placeholder", ["words", "--model.modalities.images.token_id=9"],
     r"model.modalities.images.token_id \(9\) is an id the tokenizer in '.*' writes for text"),
    ("tokenizer larger than vocab", ["words", "--model.llm.vocab=12", "--model.modalities.images.token_id=3"],
     r"model.llm.vocab \(12\) is smaller than the tokenizer in '.*' \(13 ids\); set model.llm.vocab to at least 13"),
])
def test_bad_tokenizer_is_refused_by_mimo_train(case, overrides, message, word_tokenizer, capsys, tmp_path):
    folder = {"corrupt": lambda: corrupt_copy(word_tokenizer, tmp_path / "corrupt"),
              "empty": lambda: (tmp_path / "empty").mkdir() or tmp_path / "empty",
              "words": lambda: word_tokenizer}[overrides[0]]()
    err = train_refusal(capsys, tmp_path, *real_data(folder, *overrides[1:]))
    assert err.startswith("mimo: error: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err


def test_the_tokenizer_image_token_and_unused_ids_pass(word_tokenizer, tmp_path):
    """LLaVA's convention (the tokenizer's own "<image>") and an id past the tokenizer are no collision."""
    for token_id in (3, 13):
        cfg = load_config(DEMO, [*TINY, *real_data(word_tokenizer, f"--model.modalities.images.token_id={token_id}")])
        check_tokenizer(cfg, cfg.model)


def test_cuda_on_a_cpu_only_build_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = train_refusal(capsys, tmp_path, "--train.device=cuda")
    assert "mimo: error: train.device = 'cuda' but this torch build" in err and 'use train.device = "cpu"' in err
    err = train_refusal(capsys, tmp_path, "--train.device=gpu0")
    assert "mimo: error: train.device = 'gpu0'; use \"cpu\" or \"cuda\"" in err


def test_layouts_that_failed_at_the_first_batch_are_refused_at_the_gate():
    """On main at 5979b0d these passed every check and died later on every rank: LM cp2 x tp4 + SP on the
    demo's 40-token rows at the first batch (in ContextParallel.shard_batch), a sequence-parallel ViT whose 5
    tokens tp 2 cannot split at build (in parallelize_vit), both after the process groups were made. (Encoder
    dp 3 beside LM dp 2, refused here once, now trains: tests/distributed/test_colocated_layouts.py.)"""
    lm = ["--parallel.modules.language.cp=2", "--parallel.modules.language.tp=4", "--model.llm.heads=4",
          "--model.llm.kv_heads=4", "--parallel.modules.language.sequence_parallel=true", "--data.global_batch=8",
          "--model.modalities.images.vit.patch=8"]
    assert "the LM's rows of 40 tokens (data.name = 'shapes') must divide by 16 (2 x cp x tp" in layout_error(8, *lm)
    assert "rows of 24 tokens (data.name = 'synthetic') must divide by 16" in layout_error(
        8, *lm, "--data.name=synthetic", "--data.seq_len=24")
    vit = ["--parallel.modules.images.tp=2", "--parallel.modules.images.sequence_parallel=true"]
    assert "module 'images': sequence parallel splits the ViT's 5 tokens" in layout_error(2, *vit)


@pytest.mark.parametrize("lm", [
    ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true"],
    ["--parallel.modules.language.cp=2"],
    ["--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2",
     "--parallel.modules.language.sequence_parallel=true"],
], ids=["tp2_sp", "cp2", "cp2_tp2_sp"])
def test_out_path_with_a_sharded_lm_sequence_passes_the_gate(lm):
    """The Out path gathers the LM's sharded sequence whole before it decodes (ModelRuntime.gather_sequence), so the
    gate, which refused LM sequence and context parallelism beside it, accepts them; they train like one process
    in tests/distributed/test_colocated_layouts.py."""
    cfg = load_config(T2I, [*TINY_T2I, "--model.llm.heads=4", "--model.llm.kv_heads=2", *lm])
    check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))


@pytest.mark.parametrize("overrides, message", [
    (["--model.llm.hidden=24", "--model.llm.heads=3", "--model.llm.kv_heads=3"],
     r"'language': heads \(3\) is not divisible by tp"),
    (["--model.llm.heads=4", "--model.llm.kv_heads=1"], r"'language': kv_heads \(1\) is not divisible by tp"),
    (["--model.llm.vocab=273"], r"model.llm.vocab \(273\) must be divisible by the LM's tp \(2\)"),
    (["--model.llm.mlp=65"], r"model.llm.mlp \(65\) must be divisible by the LM's tp \(2\)"),
])
def test_tensor_parallel_sizes_are_checked_at_the_gate(overrides, message):
    """What parallelize_lm used to check again (now an assert there)."""
    assert re.search(message, layout_error(2, "--parallel.modules.language.tp=2", "--model.llm.kv_heads=2", *overrides))


@pytest.mark.parametrize("overrides, message", [
    (["--model.modalities.images.vit.heads=3", "--model.modalities.images.vit.hidden=24"],
     r"'images': heads \(3\) is not divisible by tp"),
    (["--model.modalities.images.vit.mlp=65"], r"model.modalities.images.vit.mlp \(65\) must be divisible by its tp"),
])
def test_vit_tensor_parallel_sizes_are_checked_at_the_gate(overrides, message):
    """What parallelize_vit used to check again (now an assert there)."""
    assert re.search(message, layout_error(2, "--parallel.modules.images.tp=2", *overrides))


def test_fsdp_over_cp_and_tensor_parallel_chunks_is_refused_before_training():
    """FSDP over TP chunks checkpoints as 2-D (tp, dp) DTensors (tests/distributed/test_fsdp_tp_checkpoint.py);
    FSDP over cp x dp of TP chunks does not, so the gate refuses it and passes tp x FSDP alone."""
    lm = ["--parallel.modules.language.tp=2", "--parallel.modules.language.fsdp=true", "--model.llm.kv_heads=2"]
    message = layout_error(8, *lm, "--parallel.modules.language.cp=2", "--data.global_batch=8")
    assert re.search(r"parallel.modules.language: fsdp = true with tp = 2 and cp = 2 .* set "
                     r"parallel.modules.language.fsdp = false, tp = 1 or cp = 1", message)
    cfg = load_config(DEMO, [*TINY, *lm])
    check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))


@pytest.mark.parametrize("overrides, message", [
    (["--data.name=shape"], r"data.name = 'shape' is not a known data set; use one of shapes, avlm"),
    (["--data.name=avlm"], r"data.name = 'avlm' needs one vision and one audio modality under model.modalities"),
    (["--model.freeze_llm=true", "--model.modalities.images.freeze_encoder=true",
      "--model.modalities.images.freeze_projector=true"], r"model.freeze_llm = true and every modality's .* nothing "
                                                          r"would train; unfreeze a module"),
    (["--data.name=synthetic", "--data.seq_len=8", "--data.images_per_sample=2"],
     r"data.seq_len \(8\) must exceed the 8 image placeholders of a sample"),
    (["--model.modalities.images.anyres_grid_pinpoints=[[32, 64], [64, 32]]", "--data.name=synthetic"],
     r"model.modalities.images.anyres_grid_pinpoints is set, but data.name = 'synthetic' does not tile images "
     r"\(the shapes demo, jsonl and webdataset do\).*or with anyres_grid_pinpoints = \[\]"),
])
def test_a_model_or_data_set_that_cannot_train_is_refused(overrides, message, capsys, tmp_path):
    """Found in build_demo_data before, after the model was built and laid out; a model with nothing to train
    failed at the first backward in torch's words ("element 0 of tensors does not require grad")."""
    assert re.search(message, train_refusal(capsys, tmp_path, *overrides))


def test_layout_checks_see_the_architecture_of_hf_path(tmp_path):
    """The LM of model.llm.hf_path has 97 ids; the config file's model.llm.vocab (272) would pass tp 2. On main
    at 5979b0d parallelize_lm found it, after the process groups were made."""
    tiny_causal_lm("llama").save_pretrained(tmp_path / "lm")
    cfg = load_config(DEMO, [*TINY, f"--model.llm.hf_path={tmp_path / 'lm'}", "--parallel.modules.language.tp=2",
                             "--data.name=synthetic", "--model.modalities.images.token_id=96"])
    with pytest.raises(ConfigError, match=r"model.llm.vocab \(97\) must be divisible by the LM's tp \(2\)"):
        validate_run(cfg, 2)
    assert cfg.model.llm.vocab == 272  # the gate checks a resolved copy; build_model resolves the run's own
