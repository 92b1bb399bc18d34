"""LLaVA-NeXT and LLaVA-OneVision out: a random anyres model (built from a config asking for the tiling) exported
with the byte tokenizer, live or from a run's checkpoint, loads with `AutoProcessor` and transformers' class as they
are; on a left-padded batch of prompts with images of different sizes the logits match in fp32 and `generate` gives
mimo's greedy tokens."""

import json
import stat

import pytest
import torch

from mimo.cli import main
from mimo.data.prompts import PromptRequest, generate_text
from mimo.data.tokenizer import ByteTokenizer
from mimo.export.hf import export_llava
from mimo.export.llava_next import export_llava_next
from mimo.hf.build import build_model
from mimo.models.anyres import AnyResSubmodules
from mimo.models.generate import greedy_generate
from mimo.models.multimodal import MimoModel
from mimo.train.checkpoint.weights import load_run
from tests.support.anyres_export import (
    CASES,
    PINPOINTS,
    PROMPTS,
    SIZES,
    STEPS,
    anyres_config,
    images,
    processed,
    saved_anyres_run,
)
from tests.support.hf_helpers import TOL, perturb, rel_diff, transformers

pytestmark = pytest.mark.usefixtures("one_thread")


def anyres_model(tower: str, max_tiles: int) -> MimoModel:
    torch.manual_seed(0)
    return perturb(build_model(anyres_config(tower, max_tiles)), scale=0.3).eval()


def mimo_inputs(sub: AnyResSubmodules, inputs) -> dict:
    """The processor's `[n, tiles, C, S, S]` pixels (padded to the most tiles) as the tiles of each image."""
    counts = [1 + r * c for r, c in (sub.tiles_of(tuple(s)) for s in inputs.image_sizes.tolist())]
    pixels = torch.cat([p[:n] for p, n in zip(inputs.pixel_values, counts)])
    return {"images": {"vit": {"pixel_values": pixels, "image_sizes": inputs.image_sizes}}}


def check_export(model: MimoModel, out, max_tiles: int) -> list[list[int]]:
    """Placeholder counts, fp32 logits and greedy tokens of the directory `out` against `model`; transformers'
    greedy tokens of each prompt (padding dropped)."""
    hf = getattr(transformers, json.loads((out / "config.json").read_text())["architectures"][0])
    hf = hf.from_pretrained(out).float().eval()
    inputs = processed(out, max_tiles)
    sub = model.modality_submodules["images"]
    ours_in = mimo_inputs(sub, inputs)
    tiles = [1 + r * c for r, c in (sub.tiles_of(tuple(s)) for s in inputs.image_sizes.tolist())]
    with torch.no_grad():
        per_image = [len(sub({"vit": {"pixel_values": p[:n], "image_sizes": s[None]}}))
                     for p, s, n in zip(inputs.pixel_values, inputs.image_sizes, tiles)]
    # The processor expands each <image> into the rows the model gives that image (they differ by size).
    assert (inputs.input_ids == ByteTokenizer.IMAGE).sum(1).tolist() == per_image and len(set(per_image)) > 1
    real = inputs.attention_mask.bool()
    with torch.no_grad():
        ref = hf(**inputs).logits
        ours = model(inputs.input_ids, modality_inputs=ours_in, attention_mask=inputs.attention_mask).logits
    assert rel_diff(ours[real], ref[real]) <= TOL
    made = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:]
    mine = greedy_generate(model, inputs.input_ids, ours_in, STEPS, ByteTokenizer.EOS,
                           attention_mask=inputs.attention_mask)
    theirs = [[t for t in row if t != ByteTokenizer.PAD] for row in made.tolist()]
    assert mine == theirs
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in out.iterdir())
    return theirs


@pytest.mark.parametrize("case", list(CASES))
def test_anyres_export_matches_transformers(case, tmp_path):
    tower, max_tiles, arch = CASES[case]
    model = anyres_model(tower, max_tiles)
    out = export_llava_next(model, tmp_path / "out", tokenizer="byte")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch] and config["image_grid_pinpoints"] == PINPOINTS
    check_export(model, out, max_tiles)


def test_a_run_configured_as_anyres_exports_from_its_checkpoint(tmp_path):
    """`mimo export` of a run whose config asks for anyres tiling (OneVision, grids shrunk) streams it out of the
    sharded checkpoint, image_newline included; `mimo generate --image` on the run, tiling the images itself,
    answers with transformers' greedy tokens on the export."""
    run = saved_anyres_run(tmp_path, "siglip", 1)
    with pytest.raises(SystemExit) as done:
        main(["export", "--run", str(run), "--to", str(tmp_path / "out")])
    assert done.value.code == 0
    loaded, model = load_run(run)
    theirs = check_export(model.eval(), tmp_path / "out", 1)
    paths = [tmp_path / f"{i}.png" for i in range(len(SIZES))]
    for image, path in zip(images(), paths):
        image.save(path)
    requests = [PromptRequest(p, (str(path),)) for p, path in zip(PROMPTS, paths)]
    assert generate_text(loaded, model, requests, STEPS, str(run)) == [ByteTokenizer().decode(t) for t in theirs]


def test_llava_export_refuses_an_anyres_model(tmp_path):
    with pytest.raises(ValueError, match="export_llava_next"):
        export_llava(anyres_model("clip", 0), tmp_path / "out")


def test_a_tower_that_drops_a_patch_is_refused(tmp_path):
    model = anyres_model("clip", 0)
    model.modality_submodules["images"].encoders["vit"].cfg.drop_class_token = False
    with pytest.raises(ValueError, match="vit.drop_class_token = true"):
        export_llava_next(model, tmp_path / "out")
