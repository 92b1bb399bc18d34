"""Native-resolution (Qwen2-VL-style) image data for tests: tiny overrides, images written to disk, a manifest."""

import json

import numpy as np
from PIL import Image

from mimo.data.batching import COUNTS
from mimo.models.flops import module_step_flops

SIZES = [(40, 72), (100, 30), (33, 33), (200, 150)]  # (height, width)
TINY = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
        "--model.llm.mlp=64", "--model.modalities.images.native.hidden=16", "--model.modalities.images.native.heads=2",
        "--model.modalities.images.native.mlp=32", "--data.seq_len=160", "--data.global_batch=4",
        "--metrics.progress=false", "--metrics.tensorboard=false", "--train.log_every=1", "--train.threads=1",
        "--optim.warmup_steps=1"]


def write_image(path, size, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return str(path)


def manifest(tmp_path, several: bool = False) -> str:
    """Images of SIZES, a 3-frame video, a missing image; `several`: then a sample of two images (40 x 72, 100 x
    30) and a text-only one."""
    lines = [{"image": write_image(tmp_path / f"i{k}.png", s, k), "caption": f"picture {k}"}
             for k, s in enumerate(SIZES)]
    frames = [write_image(tmp_path / f"v{k}.png", (48, 64), 10 + k) for k in range(3)]
    lines.append({"video": frames, "fps": 1.0, "caption": "a short clip"})
    lines.append({"image": str(tmp_path / "missing.png"), "caption": "gone"})  # skipped and counted
    if several:
        lines.append({"image": [str(tmp_path / "i0.png"), str(tmp_path / "i1.png")], "caption": "two pictures"})
        lines.append({"image": [], "caption": "none"})
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def batch_facts(trainer) -> tuple[list[int], list[int], dict[str, int]]:
    """What every rank's first global batch must agree on with the single process's, whichever rows the rank reads
    (the colocated bridges' `microbatch_rows`, the step's FLOPs): each row's placeholders and inputs of the model's
    one modality, and the batch's model FLOPs by module. Collective among the ranks that read data."""
    cfg = trainer.cfg
    batch = trainer.data.global_batch(0, cfg.data.global_batch, cfg.data.seed)
    (name, m), = cfg.model.modalities.items()
    return ((batch["input_ids"] == m.token_id).sum(1).tolist(), batch[COUNTS][name].tolist(),
            module_step_flops(cfg.model, batch))
