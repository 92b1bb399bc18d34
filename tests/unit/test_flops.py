"""Step FLOPs on hand-counted multi-image and audio batches (the benchmark baseline's count on its presets:
tests/unit/test_benchmark.py), and the throughput rates built on them."""

import time

import numpy as np
import torch

from mimo.config.schema import AudioConfig, ModalityConfig, ModelConfig, ViTConfig
from mimo.data.anyres_tiles import tile_image
from mimo.models.anyres import tile_count
from mimo.models.flops import anyres_flops, train_step_flops
from mimo.models.sample_rows import OUTPUT_LENGTHS
from mimo.train.throughput import Throughput
from tests.support.configs import tiny_llm


def meta(*shape: int) -> torch.Tensor:
    """A tensor with a shape and no storage: the count must read shapes only."""
    return torch.empty(*shape, device="meta")


LLM = tiny_llm(vocab=10, hidden=4, layers=1, heads=2, kv_heads=1, mlp=6)
# Per token: q, o 2*4*4; k, v 2*4*1*2; SwiGLU 3*4*6; head 4*10 -> 32 + 16 + 72 + 40 = 160 weights.
# LM forward of S tokens: 2*160*S + 1*2*S^2*4.


def lm(seq: int) -> int:
    return 2 * 160 * seq + 8 * seq * seq


def test_multi_image_batch_by_hand():
    vit = ViTConfig(image=4, patch=2, channels=3, hidden=2, layers=1, heads=1, mlp=3)
    cfg = ModelConfig(llm=LLM, modalities={"img": ModalityConfig(vit=vit, token_id=9)})
    # 3 images in 2 samples of 20 tokens. Per image: 4 patches + class token = 5 positions;
    # weights 1*(4*2*2 + 2*2*3) + 3*2*2*2 = 28 + 24 = 52; attention 1*4*5*5*2 = 200.
    # Projector: 4 rows per image (class token dropped), 2*(2*4 + 4*4) = 48 FLOPs a row.
    batch = {"input_ids": meta(2, 20), "modality_counts": {"img": torch.tensor([1, 2])},
             "modality_inputs": {"img": {"vit": {"pixel_values": meta(3, 3, 4, 4)}}}}
    image = 2 * 52 * 5 + 200 + 48 * 4
    assert train_step_flops(cfg, batch) == 3 * (2 * lm(20) + 3 * image)


PINPOINTS = [[16, 32], [32, 16], [32, 32]]
TILES = {(8, 8): 3, (33, 33): 5, (20, 40): 3, (50, 17): 3}
"""Tiles of 16 pixels at PINPOINTS, by hand (kept = pixels of the image scaled to fit, capped at its own; ties: least
padding): 8 x 8 keeps its 64 at every pinpoint -> the least padded 16 x 32, 1 x 2 + the overview = 3. 33 x 33 keeps
32 x 32 = 1,024 at 32 x 32, 16 x 16 at the others -> 2 x 2 + 1 = 5. 20 x 40 scales by 0.8 to 16 x 32 at both 16 x
32 and 32 x 32 -> the unpadded 16 x 32, 3. 50 x 17 keeps 32 x 10 at 32 x 16 and 32 x 32 -> 32 x 16, 2 x 1 + 1 = 3."""


def test_anyres_images_cost_their_tiles_by_hand():
    vit = ViTConfig(image=16, patch=8, channels=3, hidden=2, layers=1, heads=1, mlp=3)
    m = ModalityConfig(vit=vit, token_id=9, anyres_grid_pinpoints=PINPOINTS)
    cfg = ModelConfig(llm=LLM, modalities={"img": m})
    for size, tiles in TILES.items():
        cut = tile_image(np.zeros((*size, 3), np.uint8), PINPOINTS, 16)  # what the data path cuts
        assert tile_count(size, 16, PINPOINTS) == tiles == len(cut)
    # Per tile: 4 patches + class token = 5 positions; weights 1*(4*2*2 + 2*2*3) + 3*8*8*2 = 28 + 384 = 412;
    # attention 1*4*5*5*2 = 200; projector over 4 rows, 2*(2*4 + 4*4) = 48 a row.
    tile = 2 * 412 * 5 + 200 + 48 * 4
    assert anyres_flops(m, (33, 33), 4) == 5 * tile
    sizes = list(TILES)  # rows of 1 and 3 images, zero-padded to the most tiles (5)
    batch = {"input_ids": meta(2, 20), "modality_counts": {"img": torch.tensor([1, 3])},
             "modality_inputs": {"img": {"vit": {"pixel_values": meta(4, 5, 3, 16, 16),
                                                 "image_sizes": torch.tensor(sizes)}}}}
    assert train_step_flops(cfg, batch) == 3 * (2 * lm(20) + (3 + 5 + 3 + 3) * tile)
    # OneVision's several-image prompt: its three images are not tiled (mimo.models.anyres.tiled_images), one tile each.
    batch["modality_inputs"]["img"]["vit"]["tiled"] = torch.tensor([True, False, False, False])
    assert train_step_flops(cfg, batch) == 3 * (2 * lm(20) + (3 + 1 + 1 + 1) * tile)


def test_audio_batch_by_hand():
    audio = AudioConfig(n_mels=3, hidden=2, layers=1, heads=1, mlp=4)
    cfg = ModelConfig(llm=LLM, modalities={"speech": ModalityConfig(kind="audio", audio=audio, token_id=9)})
    # 2 clips of 7 mel frames -> 4 positions after the stride-2 conv; 3 + 2 rows kept for the projector.
    # conv1 2*3*3*2*7 = 252, conv2 2*3*2*2*4 = 96; blocks 2*(4*2*2 + 2*2*4)*4 = 256; attention 4*4*4*2 = 128.
    features = {"input_features": meta(2, 3, 7), OUTPUT_LENGTHS: torch.tensor([3, 2])}
    batch = {"input_ids": meta(1, 12), "modality_counts": {"speech": torch.tensor([2])},
             "modality_inputs": {"speech": {"whisper": features}}}
    clip = 252 + 96 + 256 + 128
    projector = 2 * (2 * 4 + 4 * 4) * 5
    assert train_step_flops(cfg, batch) == 3 * (lm(12) + 2 * clip + projector)


def test_rates_per_gpu_with_mfu_and_memory_on_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    gpu = Throughput(world=4, peak_tflops=1000.0, device=torch.device("cuda", 0), start=0.0)
    gpu.add(8 * 10**15, tokens=5000)
    assert gpu.summary(wall=2.0) == {"tokens_per_s": 2500.0, "model_tflops": 1000.0, "mfu": 1.0, "peak_mem_gib": 3.0,
                                     "steady_steps": 1, "steady_s": 2.0, "steady_tokens_per_s": 2500.0,
                                     "steady_model_tflops": 1000.0, "steady_mfu": 1.0}
    cpu = Throughput(world=1, peak_tflops=1000.0, device=torch.device("cpu"), start=0.0)
    cpu.add(10**12, tokens=10)
    assert cpu.summary(wall=4.0) == {"tokens_per_s": 2.5, "model_tflops": 0.25, "steady_steps": 1, "steady_s": 4.0,
                                     "steady_tokens_per_s": 2.5, "steady_model_tflops": 0.25}


def test_steady_state_leaves_the_warm_up_steps_out(monkeypatch):
    clock = iter([10.0, 16.0, 100.0])  # end of warm-up, progress bar, (the summary reads no clock)
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 2**30)
    t = Throughput(world=2, peak_tflops=100.0, device=torch.device("cuda", 0), start=0.0, warmup=2)
    t.add(10**15, tokens=1000)  # a slow first step (compilation)
    t.add(10**15, tokens=1000)  # the end of warm-up: the clock reads 10 s
    for _ in range(3):
        t.add(6 * 10**14, tokens=600)
    bar = t.running()  # 16 s: 6 s of steady steps, 1800 tokens, 1.8e15 FLOPs over 2 GPUs
    assert bar == {"tok_s": 300.0, "tflops": 150.0, "mfu": 1.5, "wall_s": 16.0}
    s = t.summary(wall=16.0)
    assert s["tokens_per_s"] == 237.5 and s["model_tflops"] == 118.8  # the whole run: 3800 tokens in 16 s
    assert {k: v for k, v in s.items() if k.startswith("steady")} == {
        "steady_steps": 3, "steady_s": 6.0, "steady_tokens_per_s": 300.0, "steady_model_tflops": 150.0,
        "steady_mfu": 1.5}


def test_evaluation_time_is_left_out_of_the_rates(monkeypatch):
    clock = iter([4.0, 10.0])  # an interval row, the progress bar
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    t = Throughput(world=1, peak_tflops=100.0, device=torch.device("cpu"), start=0.0)
    t.add(10**12, tokens=100)
    t.exclude(2.0)  # a 2 s evaluation after the step: 2 s of training in the first 4 s
    assert t.interval() == {"model_tflops": 0.5}
    t.add(10**12, tokens=100)
    assert t.running()["tok_s"] == 25.0  # 200 tokens over the 10 s less the evaluation's 2 s
    assert t.summary(wall=10.0)["steady_s"] == 8.0 and t.summary(wall=10.0)["tokens_per_s"] == 20.0


def test_no_steady_state_before_the_warm_up_is_over():
    t = Throughput(world=1, peak_tflops=100.0, device=torch.device("cpu"), start=0.0, warmup=3)
    t.add(10**12, tokens=10)
    assert t.summary(wall=1.0) == {"tokens_per_s": 10.0, "model_tflops": 1.0, "steady_steps": 0}
