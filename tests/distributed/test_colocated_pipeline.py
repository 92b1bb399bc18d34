"""Colocated layouts whose LM is pipelined train exactly what one process trains.

Every encoder runs whole on every rank beside the LM stage the rank holds; the step runs every encoder forward,
then the LM's 1F1B (or interleaved) pipeline, then every encoder backward, the rows and their gradients crossing
in one exchange each way (mimo.parallel.pipeline.colocated). Each layout's step on a global batch of 16 samples
in 4 microbatches, holding 0 to 3 images per sample (whole microbatches and data lanes text-only), is checked
against one process on the same batch: the loss, every gradient and the weights after one AdamW step with
clipping, max |diff| <= 1e-5 x max |ref| (fp32). Then `mimo train` on such a layout logs the one-process losses
(held-out ones too, rows balanced over lanes, packed rows) and checkpoints resume across it and one process;
the audio-visual demo's two encoders, the text-to-image demo's Out path, a MoE LM with expert parallelism and
real data with damaged samples train beside a pipelined LM as in one process.
"""

import contextlib
from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import Config, ModuleLayoutConfig
from mimo.data.make_shards import main as make_shards_main
from mimo.models.build import build_model
from mimo.parallel.bridge import colocated_pipelined
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.parallel.plan import ParallelPlan
from mimo.train.trainer import Trainer
from tests.support.configs import AVLM, T2I, TINY_AVLM, TINY_T2I, image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.data_folders import data_overrides, make_folder
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import (
    assert_trains_like,
    freeze_key_biases,
    reference_and_parallel_copy,
    step_matches_reference,
    trainer_steps,
)
from tests.support.pipeline_case import IMG, MICRO, RTOL, S, pipeline_reference
from tests.support.tiny_run import metrics, tiny_config, train_losses, train_rank

# 0 to 3 images per sample; microbatch 2 is text-only, and so are LM lanes of microbatches 0 and 3
IMAGES = [0, 0, 3, 1, 2, 1, 0, 3, 0, 0, 0, 0, 1, 2, 0, 0]
# (images tp, FSDP of both modules, LM tp, cp, pp, virtual stages, sequence parallel, tied embeddings) by world
LAYOUTS = {4: [(1, False, 1, 1, 2, 1, False, False), (1, False, 1, 1, 2, 2, False, True),
               (2, False, 1, 1, 2, 1, False, False), (1, True, 1, 1, 2, 1, False, False)],
           8: [(2, False, 2, 1, 2, 1, True, False), (2, False, 1, 2, 2, 1, False, True)]}


def _config(enc_tp: int, fsdp: bool, tp: int, cp: int, pp: int, chunks: int, sp: bool, tied: bool) -> Config:
    lm = ModuleLayoutConfig(tp=tp, cp=cp, pp=pp, virtual_stages=chunks, sequence_parallel=sp, fsdp=fsdp)
    images = ModuleLayoutConfig(tp=enc_tp, fsdp=fsdp)
    return tiny_vlm(tiny_llm(layers=pp * chunks + 1, init_std=0.1, tie_embeddings=tied),
                    tiny_vit(layers=2, init_std=0.1), IMG, {"images": images, "language": lm}, MICRO, len(IMAGES))


def _run_case(rank: int, world: int, *layout) -> float:
    """One layout; returns (on rank 0) the worst relative difference of loss, gradients and weights."""
    enc_tp, fsdp, tp, cp, pp, chunks, sp, tied = layout
    what = (f"fsdp {fsdp}: images tp {enc_tp} + LM tp {tp} cp {cp} pp {pp} virtual stages {chunks} sp {sp} "
            f"tied {tied}")
    cfg = _config(*layout)
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], world))
    batch = image_text_batch(torch.tensor(IMAGES), S, IMG, torch.Generator().manual_seed(7))
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda m: pipeline_reference(cfg, batch, m))
    result = plan.pipeline.train_step(par, batch, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs one process {ref['loss']}"
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in LAYOUTS[world]]


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_colocated_pipeline_equals_single_process(world):
    worst = run_distributed(_all_cases, world, timeout=300)[0]
    for case, w in zip(LAYOUTS[world], worst):
        print(f"{case}: max relative diff {w:.2e}")


def _wire_step(rank: int, world: int, dtype: str, wire: torch.dtype | None) -> tuple:
    """One step of images dp4 + LM pp2 x dp2 under `dtype` autocast, its bridge forced to cross in `wire` if
    given: (the loss, the gradients gathered on rank 0, the dtypes of the rows and gradients this rank got)."""
    cfg = _config(*LAYOUTS[4][0])
    cfg.precision.dtype = dtype
    torch.manual_seed(0)
    model = build_model(cfg.model)
    freeze_key_biases(model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(model)
    for bridge in plan.pipeline.bridges.values():
        bridge.wire = wire or bridge.wire
    crossed, exchange = set(), colocated_pipelined._exchange

    def recorded(*args):
        got = exchange(*args)
        crossed.update(piece.dtype for parts in got for piece in parts)
        return got

    colocated_pipelined._exchange = recorded
    batch = image_text_batch(torch.tensor(IMAGES), S, IMG, torch.Generator().manual_seed(7))
    try:
        loss = plan.pipeline.train_step(model, batch, torch.device("cpu"), lambda: torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")).loss
    finally:
        colocated_pipelined._exchange = exchange
    plan.finalize_grads(model)
    return loss, plan.gather_full(model, grads=True), crossed


def _wire_cases(rank: int, world: int) -> None:
    for dtype, wire in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        loss, grads, crossed = _wire_step(rank, world, dtype, None)
        assert crossed == {wire}, f"{dtype}: rows and gradients crossed in {crossed}"
        wide_loss, wide_grads, _ = _wire_step(rank, world, dtype, torch.float32)
        assert loss == wide_loss, f"{dtype}: loss {loss} vs {wide_loss} with float32 on the wire"
        for name in wide_grads:
            assert torch.equal(grads[name], wide_grads[name]), f"{dtype}: gradient of {name}"


def test_rows_cross_in_the_encoders_dtype_and_change_nothing():
    """Under bf16 autocast the encoder's rows and their gradients cross as bf16 (half float32's bytes), under fp32
    as fp32; the loss and every gradient equal bitwise those of rows crossing as float32, which the LM's
    alignment widens them to anyway."""
    run_distributed(_wire_cases, 4, timeout=300)


TRAIN = ["--model.llm.layers=2", "--train.steps=4", "--data.global_batch=8", "--data.min_images_per_sample=0",
         "--data.images_per_sample=3", "--train.eval_every=2", "--data.eval_samples=8", "--checkpoint.save_every=3"]
LAYOUT = ["--parallel.modules.images.tp=1", "--parallel.modules.language.pp=2", "--parallel.microbatches=2"]


def _logged(out: Path, key: str) -> list[float]:
    return [m[key] for m in metrics(out) if key in m]


def test_trainer_on_a_colocated_pipeline_reproduces_one_process_and_resumes_across(tmp_path):
    """`mimo train`'s tiny demo on images dp4 + LM pp2 x dp2, its rows balanced over the lanes by cost, logs the
    one-process run's losses and held-out losses; its step-3 checkpoint loads into one process, and the one
    process's into this layout, each next step logging the uninterrupted run's loss."""
    ref = tmp_path / "one"
    Trainer(tiny_config(ref, *TRAIN)).train()
    out = tmp_path / "colocated_pipeline"
    run_distributed(train_rank, 4, str(out), [*TRAIN, *LAYOUT, "--data.balance_lanes=true"], timeout=300)
    for key, n in (("loss", 4), ("eval_loss", 2)):
        got, want = _logged(out, key), _logged(ref, key)
        assert len(got) == len(want) == n, key
        for step, (a, b) in enumerate(zip(got, want)):
            assert abs(a - b) <= 1e-5 * abs(b), f"{key} {step}: colocated pipeline {a} vs one process {b}"
    resume = f"--checkpoint.resume={out / 'tiny' / 'checkpoints' / 'step_00000003'}"
    single = Trainer(tiny_config(tmp_path / "resumed", *TRAIN, resume))
    assert single.checkpointer.resume() == 3
    loss = single.train_step(3)["loss"]
    assert abs(loss - _logged(ref, "loss")[3]) <= 1e-5 * abs(loss), (loss, _logged(ref, "loss"))
    back = tmp_path / "resumed_pipelined"
    resume = f"--checkpoint.resume={ref / 'tiny' / 'checkpoints' / 'step_00000003'}"
    run_distributed(train_rank, 4, str(back), [*TRAIN, *LAYOUT, resume], timeout=300)
    loss = _logged(back, "loss")[-1]
    assert abs(loss - _logged(ref, "loss")[3]) <= 1e-5 * abs(loss), (loss, _logged(ref, "loss"))


SMALL = ["--data.train_samples=16", "--data.eval_samples=8", "--data.global_batch=8", "--optim.warmup_steps=1",
         "--metrics.progress=false", "--metrics.tensorboard=false", "--train.threads=1", "--model.llm.layers=2",
         "--parallel.microbatches=2", "--optim.eps=1e-2"]


def _demo_steps(rank: int, world: int, config: str, out: str, overrides: list[str]) -> tuple[list[float], list[dict]]:
    """A shipped demo `config` trained for 3 steps under `overrides`: its losses and gradients (rank 0's)."""
    trainer = Trainer(load_config(config, [*overrides, *SMALL, f"--run.out_dir={out}"]))
    losses, grads = trainer_steps(trainer, 3)
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads]


T2I_TP = [*TINY_T2I, "--model.llm.kv_heads=2"]
SP = ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true"]


@pytest.mark.parametrize("config,tiny,layout", [
    (AVLM, TINY_AVLM, ["--parallel.modules.images.tp=2"]),
    (T2I, TINY_T2I, ["--parallel.modules.images.tp=2"]),
    (T2I, T2I_TP, SP),
], ids=["avlm", "text_to_image", "text_to_image_sp"])
def test_demos_beside_a_pipelined_lm_train_like_one_process(tmp_path, config, tiny, layout):
    """demo_avlm's two encoders (images tp2 x dp2, audio dp4) beside LM pp2 x dp2, batches mixing samples with an
    image, a clip, both or neither; demo_text_to_image's Out path decoding on the last stage of LM pp2 x dp2 (its
    weights reduced over the stage's lanes, not the encoder's) and of LM tp2 x pp2 with sequence parallel: every
    step's loss and gradient as one process's."""
    ref = _demo_steps(0, 1, str(config), str(tmp_path / "one"), tiny)
    pipelined = [*tiny, *layout, "--parallel.modules.language.pp=2"]
    run = run_distributed(_demo_steps, 4, str(config), str(tmp_path / "pipelined"), pipelined, timeout=300)[0]
    assert_trains_like(f"{config.name} {layout} + LM pp2", run, ref, 1e-5)


MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2", "--model.llm.layers=2",
       "--model.llm.moe_aux_loss_weight=0.05", "--model.llm.moe_z_loss_weight=0.01", "--model.llm.moe_gating=sigmoid",
       "--model.llm.moe_norm_topk=true", "--model.llm.moe_bias_rate=0.01", "--train.steps=3",
       "--parallel.microbatches=2", "--data.global_batch=8"]


def test_a_moe_lm_with_experts_over_its_lanes_logs_what_one_process_does(tmp_path):
    """The MoE LM pp2 x dp2 with its experts split over its two lanes (ep2), the encoder dp4 beside it: one
    process's losses, router losses and expert loads."""
    Trainer(tiny_config(tmp_path / "one", *MOE)).train()
    layout = [*LAYOUT, "--parallel.modules.language.ep=2"]
    run_distributed(train_rank, 4, str(tmp_path / "pipe"), [*MOE, *layout], timeout=300)
    one, pipe = ([r for r in metrics(tmp_path / name) if "moe_load" in r] for name in ("one", "pipe"))
    assert len(one) == len(pipe) == 3
    for a, b in zip(one, pipe):
        for key in ("loss", "moe_aux_loss", "moe_z_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
        for layer in ("0", "1"):
            assert b["moe_load"][layer] == pytest.approx(a["moe_load"][layer], abs=1e-6)


def _decoded_losses(rank: int, world: int, out: str, overrides: list[str]) -> tuple[list[float], dict, int]:
    tr = Trainer(tiny_config(Path(out), *overrides))
    losses = [tr.train_step(s)["loss"] for s in range(3)]
    return losses, tr.data.report(), len(tr.data.image_rows)


def test_real_data_with_damaged_samples_decodes_each_lanes_images(tmp_path):
    """A webdataset folder with broken images beside a pipelined LM: each rank decodes its encoder lane's images
    only (2 of 8) and every text row, the ranks agree on the damaged samples, and the losses are one process's."""
    src = make_folder(tmp_path)
    make_shards_main([str(src), str(tmp_path / "shards")])
    overrides = data_overrides("webdataset", tmp_path / "shards", "--train.steps=3", "--model.llm.layers=2")
    one = Trainer(tiny_config(tmp_path / "one", *overrides))
    expected = [one.train_step(s)["loss"] for s in range(3)]
    results = run_distributed(_decoded_losses, 4, str(tmp_path / "four"), [*overrides, *LAYOUT], timeout=300)
    for losses, report, rows in results:
        assert rows == 2
        assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(expected, losses)), (expected, losses)
        assert report == one.data.report()


def test_packed_rows_beside_a_pipelined_lm_train_the_unpacked_samples(tmp_path):
    """`mimo train` with data.packing on images dp4 + LM pp2 x dp2 logs the one-process unpacked run's losses."""
    train = ["--model.llm.kv_heads=1", "--model.llm.layers=2", "--train.steps=3", "--data.global_batch=8"]
    ref = train_losses(tmp_path / "padded", *train)
    packed = [*train, "--data.packing=true", "--data.pack_length=48", *LAYOUT]
    run_distributed(train_rank, 4, str(tmp_path / "packed"), packed, timeout=300)
    losses = _logged(tmp_path / "packed", "loss")
    assert len(ref) == len(losses) == 3
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: packed colocated pipeline {a} vs unpacked {b}"
