"""`mimo generate` with several `--image` flags on an anyres run: the images fill the prompts' `<image>` markers in
order (a prompt of two images of different sizes, a shorter one of one image, left-padded). The oracle is the run
exported (mimo.export.llava_next) and prepared by transformers' own processor classes: the same prompt ids, and
transformers' greedy tokens (LLaVA-NeXT tiles every image; OneVision gives each image of the two-image prompt one
square tile, `batch_num_images`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mimo.cli import main
from mimo.data.prompts import pair_inputs, prompt_batch
from mimo.data.tokenizer import ByteTokenizer
from mimo.export.llava_next import export_llava_next
from mimo.models.generate import greedy_generate, left_pad
from mimo.train.checkpoint.weights import load_run
from tests.support.anyres_export import saved_anyres_run
from tests.support.hf_helpers import transformers

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 8
SIZES = [(20, 40), (40, 24), (12, 44)]  # (height, width): the first two share a prompt
PROMPTS = ["<image>what is left<image> of this?", "<image>a"]
CASES = {"next_clip": ("clip", 0), "onevision_siglip": ("siglip", 9), "onevision_clip": ("clip", 9)}


def anyres_run(tmp_path, tower: str, max_tiles: int):
    """(config, model, run directory, image paths) of a random anyres run and its three images."""
    run = saved_anyres_run(tmp_path, tower, max_tiles)
    rng = np.random.default_rng(0)
    paths = [tmp_path / f"{i}.png" for i in range(len(SIZES))]
    for (h, w), path in zip(SIZES, paths):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    loaded, model = load_run(run)
    return loaded, model.eval(), run, paths


def hf_inputs(out, paths, max_tiles: int):
    """transformers' batch for PROMPTS: `AutoProcessor` for LLaVA-NeXT; for OneVision (whose processor needs
    torchvision) its image processor, its processor's own `replace_image_token` count of each image and the
    tokenizer."""
    nested = [[Image.open(p) for p in paths[:2]], [Image.open(paths[2])]]
    if not max_tiles:
        return transformers.AutoProcessor.from_pretrained(out)(text=PROMPTS, images=nested, padding=True,
                                                               return_tensors="pt")
    saved = json.loads((out / "processor_config.json").read_text())
    pixels = transformers.AutoImageProcessor.from_pretrained(out)(nested, return_tensors="pt")
    counter = object.__new__(transformers.LlavaOnevisionProcessor)
    counter.image_processor = transformers.LlavaOnevisionImageProcessorPil(**saved["image_processor"])
    for key in ("num_image_tokens", "vision_aspect_ratio", "vision_feature_select_strategy", "image_token"):
        setattr(counter, key, saved[key])
    texts = [t.split("<image>") for t in PROMPTS]  # each marker expanded for its image, in order
    expanded = iter(counter.replace_image_token(pixels, i) for i in range(len(paths)))
    texts = [pieces[0] + "".join(next(expanded) + piece for piece in pieces[1:]) for pieces in texts]
    tokens = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")
    return transformers.BatchFeature({**tokens, **pixels})


@pytest.mark.parametrize("case", list(CASES))
def test_generate_several_images_matches_transformers(case, tmp_path, capsys):
    tower, max_tiles = CASES[case]
    cfg, model, run, paths = anyres_run(tmp_path, tower, max_tiles)
    out = export_llava_next(model, tmp_path / "out", tokenizer="byte")
    inputs = hf_inputs(out, paths, max_tiles)
    if max_tiles:
        assert inputs.batch_num_images.tolist() == [2, 1]
    requests = pair_inputs(PROMPTS, [str(p) for p in paths], [])
    ids, ours_in, _ = prompt_batch(cfg, model, requests, str(run), ByteTokenizer())
    real = inputs.attention_mask.bool()
    assert ids == [row[m].tolist() for row, m in zip(inputs.input_ids, real)]  # placeholders at the markers
    counts = [row.count(ByteTokenizer.IMAGE) for row in ids]
    assert len(ids[0]) != len(ids[1]) and counts[0] != counts[1]
    hf = transformers.AutoModelForImageTextToText.from_pretrained(out).float().eval()
    made = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:]
    tokens = [[t for t in row if t != ByteTokenizer.PAD] for row in made.tolist()]
    padded, mask = left_pad(ids, ByteTokenizer.PAD)
    assert greedy_generate(model, padded, ours_in, STEPS, ByteTokenizer.EOS, attention_mask=mask) == tokens
    theirs = [ByteTokenizer().decode(t) for t in tokens]
    flags = [f for p in PROMPTS for f in ("--prompt", p)] + [f for p in paths for f in ("--image", str(p))]
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["generate", "--run", str(run), "--max-new-tokens", str(STEPS), *flags])
    assert done.value.code == 0
    assert capsys.readouterr().out == "".join(t + "\n" for t in theirs)


def test_image_markers_that_do_not_match_the_images_are_refused(tmp_path, capsys):
    _, _, run, paths = anyres_run(tmp_path, "siglip", 9)

    def refused(*args) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["generate", "--run", str(run), "--max-new-tokens", "2", *map(str, args)])
        assert done.value.code == 2
        return capsys.readouterr().err

    err = refused("--prompt", "<image>a<image>b", "--prompt", "<image>c", "--image", paths[0], "--image", paths[1])
    assert "the prompts hold 3 <image> marker(s) but 2 --image flag(s) were given; give one --image per <image>" in err
    rows = [{"prompt": "which is larger?", "image": [p.name for p in paths[:2]]},
            {"prompt": "<image>and<image>", "image": paths[0].name}]
    for row in rows:
        (tmp_path / "p.jsonl").write_text(json.dumps(row) + "\n")
        err = refused("--prompts", tmp_path / "p.jsonl")
        assert f"marker(s) for {len(row['image']) if isinstance(row['image'], list) else 1} image(s); write one " \
               "<image> where each image goes" in err
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "<image>a", "image": [3]}) + "\n")
    assert "line 1: \"image\" is a path or a list of paths (one per <image> marker)" in refused("--prompts",
                                                                                             tmp_path / "p.jsonl")
