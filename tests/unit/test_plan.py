"""`mimo plan`: the memory estimate by hand, the ranking, and the CLI (CPU, no processes)."""

from __future__ import annotations

import pytest
import tomllib

from mimo.cli import main
from mimo.config.load import load_config
from mimo.config.schema import Config, ModuleLayoutConfig
from mimo.models.build import build_model
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.planner.candidates import (
    FSDP,
    LM_TP,
    PLAIN_DP,
    label,
    layout_of,
    make_plan,
    pipelined_candidates,
    to_toml,
    with_modules,
)
from mimo.planner.memory import (
    GIB,
    HOST_FIXED_BYTES,
    STATE_BYTES,
    estimate,
    host_estimate,
    largest_parameter_bytes,
    module_sizes,
)
from mimo.planner.report import render
from tests.support.configs import tiny_native_vlm
from tests.support.plan_case import TINY, usage_of

LLAMA_7B = ["--model.llm.hidden=4096", "--model.llm.layers=32", "--model.llm.heads=32", "--model.llm.kv_heads=8",
            "--model.llm.mlp=11008", "--model.llm.vocab=32000"]
FIXED = 2 * GIB


def test_estimate_matches_hand_computation():
    cfg = load_config(None, TINY)
    assert module_sizes(cfg)["language"].params == 22688
    # dp2: tokens per lane = 8 / (1 x 2) x 16 = 64. States 16 B x 22688. Activations per layer 64 x 32 x 34 B,
    # two layers, plus fp32 logits and their grad 64 x 64 x 8 B.
    dp = usage_of(cfg, {"language": ModuleLayoutConfig()}, 2)
    assert dp.states == 16 * 22688
    assert dp.activations == 2 * 64 * 32 * 34 + 64 * 64 * 8
    assert dp.peak == 16 * 22688 + 2 * 64 * 32 * 34 + 64 * 64 * 8 + FIXED
    # FSDP over dp2 halves the states; activations are unchanged.
    fsdp = usage_of(cfg, {"language": ModuleLayoutConfig(fsdp=True)}, 2)
    assert fsdp.states == 16 * 22688 / 2 and fsdp.activations == dp.activations
    # tp2 (dp1, 128 tokens): sharded = 2 x 9216 + 2048 + 2048 = 22528 -> /2; norms 2 x 64 / 2 + 32 stay whole.
    # Activations without SP: 128 x 32 x (10 + 24/2) per layer; logits 128 x 64 x 8 / 2.
    tp = usage_of(cfg, {"language": ModuleLayoutConfig(tp=2)}, 2)
    assert tp.states == 16 * (22528 / 2 + 128 + 32)
    assert tp.activations == 2 * 128 * 32 * 22 + 128 * 64 * 8 / 2
    # With sequence parallel the layers' activations are 34 / tp per token per hidden unit.
    sp = usage_of(cfg, {"language": ModuleLayoutConfig(tp=2, sequence_parallel=True)}, 2)
    assert sp.activations == 2 * 128 * 32 * 17 + 128 * 64 * 8 / 2
    # A tied head is the embedding: 2048 parameters fewer, counted once where one GPU holds both ends.
    tied = load_config(None, [*TINY, "--model.llm.tie_embeddings=true"])
    assert module_sizes(tied)["language"].params == 22688 - 2048
    assert usage_of(tied, {"language": ModuleLayoutConfig()}, 2).states == 16 * (22688 - 2048)


def test_activation_checkpointing_keeps_each_layers_input_and_recomputes_one_layer():
    ckpt = '--perf.activation_checkpointing=["language"]'
    # dp2, 64 tokens per lane: each of the 2 layers keeps its fp32 input, 64 x 32 x 4 B; the backward rebuilds
    # one layer's activations at a time, 64 x 32 x 34 B, once; the logits stay as they were.
    dp = usage_of(load_config(None, [*TINY, ckpt]), {"language": ModuleLayoutConfig()}, 2)
    assert dp.activations == 2 * 64 * 32 * 4 + 64 * 32 * 34 + 64 * 64 * 8
    # tp2 with sequence parallel (128 tokens): the inputs are sharded too, 128 x 32 x 4 / 2 B per layer.
    sp = usage_of(load_config(None, [*TINY, ckpt]), {"language": ModuleLayoutConfig(tp=2, sequence_parallel=True)}, 2)
    assert sp.activations == 2 * 128 * 32 * 2 + 128 * 32 * 17 + 128 * 64 * 8 / 2
    # pp2, 4 microbatches, 32 tokens each: the last stage (one microbatch: its layer's input, the logits, and
    # the recompute) has more than the first (two inputs and the recompute), and its states are the larger.
    four = load_config(None, [*TINY, "--parallel.microbatches=4", ckpt])
    pp = usage_of(four, {"language": ModuleLayoutConfig(pp=2)}, 2)
    assert pp.activations == 32 * 32 * 4 + 32 * 64 * 8 + 32 * 32 * 34


def test_pipeline_first_stage_holds_microbatches_in_flight():
    # pp2 over 2 ranks, 4 microbatches: stage 0 holds min(2, 4) = 2 microbatches of 8/4 x 16 = 32 tokens of its
    # one layer, plus the embedding; stage 1 one microbatch, the head and its logits. Stage 0 is the worst.
    cfg = load_config(None, [*TINY, "--parallel.microbatches=4"])
    u = usage_of(cfg, {"language": ModuleLayoutConfig(pp=2)}, 2)
    assert u.states == 16 * (9216 + 2048 + 64 + 32)
    assert u.activations == 2 * 32 * 32 * 34
    # 3 layers: stage 0 holds 1 of them (earlier stages take the smaller share), stage 1 holds 2, the final
    # norm and the head: stage 1, with one microbatch of 2 layers and the logits, is now the worst.
    three = load_config(None, [*TINY, "--parallel.microbatches=4", "--model.llm.layers=3"])
    u = usage_of(three, {"language": ModuleLayoutConfig(pp=2)}, 2)
    assert u.states == 16 * (2 * 9216 + 2 * 64 + 2048 + 32)
    assert u.activations == 2 * 32 * 32 * 34 + 32 * 64 * 8


def test_demo_on_8_gpus_suggests_plain_data_parallel():
    cfg = load_config("configs/demo_vlm.toml")
    plan = make_plan(cfg, 8, 80)
    best = plan.rows[0]
    assert best.fits and best.prediction.step_s == min(r.prediction.step_s for r in plan.rows if r.fits)
    assert any(r.klass == PLAIN_DP and label(r.layout, r.modules) == "dp8" and r.fits for r in plan.rows)
    assert 1 < len(plan.rows) <= 40
    for row in plan.rows:  # every row's printed TOML, read back as a config, passes the trainer's checks
        tables = tomllib.loads(to_toml(row.modules, cfg.parallel.microbatches, row.layout))["parallel"]
        modules = {n: ModuleLayoutConfig(**t) for n, t in tables["modules"].items()}
        layout = Layout.from_config(modules, ["language", "images"], 8)
        validate_plan(with_modules(cfg, modules), layout)
        assert layout.grids == row.layout.grids


def test_7b_lm_does_not_fit_replicated():
    cfg = load_config("configs/demo_vlm.toml", LLAMA_7B)
    assert 5.5e9 < module_sizes(cfg)["language"].params < 7e9
    plan = make_plan(cfg, 8, 80)
    (dp8,) = [r for r in plan.rows if r.klass == PLAIN_DP]
    assert not dp8.fits and dp8.peak_gib > 80 and "does not fit" in dp8.why
    assert plan.rows[0].fits and plan.rows[0].klass in (FSDP, LM_TP)


def test_a_plan_that_does_not_fit_suggests_checkpointing_which_lowers_the_estimate():
    """A 7B LM with long sequences on one 80 GiB GPU: nothing fits, and the warning names
    perf.activation_checkpointing; with it set, the best estimate drops and the header says so."""
    cfg = load_config("configs/demo_vlm.toml", [*LLAMA_7B, "--data.seq_len=4096", "--data.global_batch=8"])
    plain = make_plan(cfg, 1, 80)
    assert not plain.rows[0].fits
    text = render(cfg, plain)
    assert 'Checkpoint activations (perf.activation_checkpointing = ["language", "images"])' in text
    ckpt_cfg = load_config("configs/demo_vlm.toml", [*LLAMA_7B, "--data.seq_len=4096", "--data.global_batch=8",
                                                     '--perf.activation_checkpointing=["language", "images"]'])
    ckpt = make_plan(ckpt_cfg, 1, 80)
    assert ckpt.rows[0].usage.activations < 0.2 * plain.rows[0].usage.activations
    text = render(ckpt_cfg, ckpt)
    assert "activation checkpointing of language, images" in text and "Checkpoint activations" not in text


def test_cli_plan_prints_table_and_toml(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "configs/demo_vlm.toml", "--gpus", "8", "--gpu-memory-gib", "80"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "suggested: dp8" in out and "[parallel.modules.language]" in out and "peak GiB" in out


@pytest.mark.parametrize("argv", [["--gpus", "0"], ["--gpus", "16", "--data.global_batch=30"]])
def test_cli_plan_bad_gpus(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(["plan", "configs/demo_vlm.toml", *argv])
    assert e.value.code == 2
    assert "--gpus" in capsys.readouterr().err


def test_cli_plan_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--gpus" in out and "--gpu-memory-gib" in out


def test_pipelined_split_takes_its_cheapest_lm_layout_when_none_fits():
    """At 24 GiB no LM layout on 4 of 8 GPUs fits the 5.9B LM; the row for that split must then be the
    lowest estimate among the LM layouts the trainer accepts there (replicated or FSDP-sharded), not the
    first one tried (tp1 pp1)."""
    cfg = load_config("configs/demo_vlm.toml", LLAMA_7B)
    sizes = module_sizes(cfg)
    (row,) = [r for r in make_plan(cfg, 8, 24).rows if r.layout.grids["images"].size == 4]
    assert not row.fits
    enc = ModuleLayoutConfig(offset=0, size=4)
    peaks = []
    for tp, pp, fsdp in ((1, 1, False), (1, 1, True), (1, 2, False), (1, 2, True), (1, 4, False), (2, 1, False),
                         (2, 2, False), (4, 1, False)):
        mods = {"images": enc, "language": ModuleLayoutConfig(offset=4, size=4, tp=tp, pp=pp, fsdp=fsdp)}
        layout = layout_of(cfg, mods, 8)
        if layout is not None:
            peaks.append(estimate(cfg, layout, sizes, mods).peak)
    assert len(peaks) > 1 and row.usage.peak == min(peaks) < max(peaks)


def test_a_pipelined_lm_is_sharded_where_only_sharding_makes_it_fit():
    """The 5.9B LM on 4 of 8 GPUs beside its encoder, at 40 GiB: replicated on those 4 it does not fit, FSDP-sharded
    over its 4 lanes (1/4 of the states a GPU) it does with the least tp x pp, so that split's row is the sharded
    one, and its printed TOML says fsdp = true; with tp > 1 the gate refuses sharding an LM on its own ranks, and
    so does the planner."""
    cfg = load_config("configs/demo_vlm.toml", LLAMA_7B)
    sizes = module_sizes(cfg)
    (row,) = [r for r in make_plan(cfg, 8, 40).rows if r.layout.grids["images"].size == 4]
    lm = row.layout.grids["language"]
    assert row.fits and row.modules["language"].fsdp and (lm.tp, lm.pp, lm.dp) == (1, 1, 4)
    enc = ModuleLayoutConfig(offset=0, size=4)
    replicated = {"images": enc, "language": ModuleLayoutConfig(offset=4, size=4)}
    assert estimate(cfg, layout_of(cfg, replicated, 8), sizes, replicated).peak > 40 * GIB
    assert row.usage.states < estimate(cfg, layout_of(cfg, replicated, 8), sizes, replicated).states / 3
    sharded_tp = {"images": enc, "language": ModuleLayoutConfig(offset=4, size=4, tp=2, fsdp=True)}
    assert layout_of(cfg, sharded_tp, 8) is None
    assert "fsdp = true" in to_toml(row.modules, cfg.parallel.microbatches, row.layout)


def test_pipelined_splits_also_try_their_encoders_sharded():
    """Every pipelined split is tried with its encoder FSDP-sharded over its own ranks too (more than one), and the
    gate accepts exactly the sharded-encoder layouts whose replicated twins it accepts; where both fit, the
    replicated encoder is the split's row (sharding gathers every weight twice a microbatch)."""
    cfg = load_config("configs/demo_vlm.toml", LLAMA_7B)
    asked: list[dict] = []
    pipelined_candidates(cfg, 8, asked.append)
    sharded = [m for m in asked if m["images"].fsdp]
    assert sharded and all(m["images"].size > 1 for m in sharded)
    assert not [m for m in asked if m["images"].size == 1 and m["images"].fsdp]
    for m in sharded:
        twin = {**m, "images": ModuleLayoutConfig(offset=m["images"].offset, size=m["images"].size)}
        assert (layout_of(cfg, m, 8) is None) == (layout_of(cfg, twin, 8) is None), m
    assert any(layout_of(cfg, m, 8) is not None for m in sharded)
    rows = [r for r in make_plan(cfg, 8, 80).rows if r.layout.grids["images"].offset == 0 and r.fits
            and r.layout.grids["language"].offset > 0]
    assert rows and not any(r.modules["images"].fsdp for r in rows)


def test_a_hugging_face_lm_is_planned_with_its_own_shapes(tmp_path):
    """The trainer's checks and the sizes both see config.json's shapes: 8 KV heads allow LM tp8 (the
    TOML's 4 would not), and its 2 layers allow no pp3 (the TOML's 3 would)."""
    transformers = pytest.importorskip("transformers")
    lm_cfg = transformers.LlamaConfig(vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=8)
    transformers.LlamaForCausalLM(lm_cfg).save_pretrained(tmp_path / "lm")
    cfg = load_config("configs/demo_vlm.toml", [f"--model.llm.hf_path={tmp_path / 'lm'}"])
    assert (cfg.model.llm.kv_heads, cfg.model.llm.layers) == (4, 3)
    plan = make_plan(cfg, 8, 80)
    lm = [r.layout.grids["language"] for r in plan.rows]
    assert max(g.tp for g in lm) == 8 and max(g.pp for g in lm) <= 2
    assert plan.sizes["language"].params == sum(p.numel() for p in transformers.LlamaForCausalLM(lm_cfg).parameters())


def test_host_estimate_by_phase_matches_hand_computation():
    """The CPU run's peaks per phase (compared with benchmarks/bench_memory.py in BENCHMARKS.md): build holds
    this rank's fp32 weights and one full tensor (the largest: embedding or head, 2048 x 4 B), train the states,
    activations and, under FSDP, the gathered root unit and its largest other unit (weights and gradients), export two
    copies of the largest tensor; each plus the interpreter's fixed share."""
    cfg = load_config(None, TINY)
    largest = 2048 * 4
    assert largest_parameter_bytes(cfg) == largest
    fsdp_modules = {"language": ModuleLayoutConfig(fsdp=True)}
    cfg_fsdp = with_modules(cfg, fsdp_modules)
    layout = layout_of(cfg_fsdp, fsdp_modules, 2)
    est = host_estimate(cfg_fsdp, layout)
    usage = usage_of(cfg_fsdp, fsdp_modules, 2)
    assert est["build"] == 4 * 22688 / 2 + largest + HOST_FIXED_BYTES
    # FSDP gathers the root (the final norm, 32) and its largest other unit: a layer (9280 parameters), larger
    # than the untied embedding's and head's own units (2048 each); 4 B weights + 4 B gradients each.
    gathered = (32 + 9280) * 8
    assert est["train"] == usage.states + usage.activations + gathered + HOST_FIXED_BYTES
    assert est["export"] == 2 * largest + HOST_FIXED_BYTES


def test_a_native_towers_blocks_are_its_layer_state():
    """The native tower keeps its blocks in `blocks` (FSDP units, as `layers` are): counted per layer, not as
    state every rank holds whole."""
    cfg = Config(model=tiny_native_vlm(layers=2))
    tower = next(iter(build_model(cfg.model).modality_submodules["images"].encoders.values()))
    blocks = sum(p.numel() for p in tower.blocks.parameters()) * STATE_BYTES
    size = module_sizes(cfg)["images"]
    assert size.layers == 2 and size.layer_sharded + size.layer_replicated == blocks
