"""LLaVA-OneVision exports through `AutoProcessor` itself, which the CPU suite cannot load: LlavaOnevisionProcessor's
video processor needs torchvision, so tests/unit/test_export_llava_next.py builds the processor's batch by parts
(`processed`). For each OneVision case there, a random run exported with `mimo export`: `AutoProcessor` gives a
LlavaOnevisionProcessor whose left-padded batch of the prompts and images is the by-parts batch; its PIL backend
tiles exactly as mimo does; transformers' greedy generation from the processor's batch is what `mimo generate`
prints. fp32 CPU tensors: what the GPU machine adds is torchvision. Marked `gpu`: skipped without a CUDA device.

    python3 -m pytest -q tests/gpu/test_processor_gpu.py      # on the GPU machine
"""

import numpy as np
import pytest
import torch

from mimo.cli import main
from mimo.data.anyres_tiles import tiled_inputs
from mimo.data.tokenizer import ByteTokenizer
from tests.support.anyres_export import CASES, PINPOINTS, PROMPTS, STEPS, images, processed, saved_anyres_run
from tests.support.hf_helpers import PIL, transformers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.usefixtures("one_thread")]

ONEVISION = [case for case, (_, max_tiles, _) in CASES.items() if max_tiles]
TILE = 16  # anyres_config's tower size


def exported_run(tmp_path, tower: str, max_tiles: int):
    """(run directory, its `mimo export` directory) of a random anyres run."""
    run = saved_anyres_run(tmp_path, tower, max_tiles)
    with pytest.raises(SystemExit) as done:
        main(["export", "--run", str(run), "--to", str(tmp_path / "out")])
    assert done.value.code == 0
    return run, tmp_path / "out"


def mimo_generate(run, tmp_path, capsys) -> str:
    """What `mimo generate` prints for PROMPTS, each with its image of `images()` (saved as PNG)."""
    flags = []
    for i, (prompt, image) in enumerate(zip(PROMPTS, images())):
        image.save(tmp_path / f"{i}.png")
        flags += ["--prompt", prompt, "--image", str(tmp_path / f"{i}.png")]
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["generate", "--run", str(run), "--max-new-tokens", str(STEPS), *flags])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("case", ONEVISION)
def test_auto_processor_batch_and_generation_match_mimo(case, tmp_path, capsys):
    tower, max_tiles, _ = CASES[case]
    run, out = exported_run(tmp_path, tower, max_tiles)
    processor = transformers.AutoProcessor.from_pretrained(out)
    assert type(processor) is transformers.LlavaOnevisionProcessor
    inputs = processor(images=images(), text=["<image>" + p for p in PROMPTS], padding=True, return_tensors="pt")
    by_parts = processed(out, max_tiles)
    assert inputs.keys() == by_parts.keys()
    for key in by_parts:
        assert torch.equal(inputs[key], by_parts[key]), key
    real = inputs.attention_mask.bool()
    assert real[:, -1].all() and len(set(real.sum(1).tolist())) == len(PROMPTS)  # left padding, three lengths
    ours = tiled_inputs([np.asarray(x) for x in images()], PINPOINTS, TILE)
    pil = transformers.AutoImageProcessor.from_pretrained(out, **PIL)(images(), return_tensors="pt")
    assert torch.equal(inputs.image_sizes, ours["image_sizes"])
    assert (pil.pixel_values - ours["pixel_values"]).abs().max() <= 1e-6
    hf = transformers.LlavaOnevisionForConditionalGeneration.from_pretrained(out).float().eval()
    made = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:]
    tokens = [[t for t in row if t != ByteTokenizer.PAD] for row in made.tolist()]
    assert mimo_generate(run, tmp_path, capsys) == "".join(ByteTokenizer().decode(t) + "\n" for t in tokens)
