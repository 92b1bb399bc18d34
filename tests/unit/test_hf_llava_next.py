"""LLaVA-NeXT in: anyres tiling (best grid resolution, tiles put back in place, cropped to the image's aspect
ratio, a newline row per line) gives transformers' logits in fp32 for images of different sizes in one batch."""

import pytest
import torch

from mimo.hf.build import build_model
from mimo.hf.llava_next import import_llava_next, import_llava_onevision
from mimo.models.anyres import select_best_resolution, tiled_images
from tests.support.hf_helpers import TOL, perturb, rel_diff, save, tiny_text_config, tiny_vision_config, transformers

reference = transformers.image_processing_utils.select_best_resolution

pytestmark = pytest.mark.usefixtures("one_thread")

IMG = 96
PINPOINTS = [[16, 32], [32, 16], [32, 32], [16, 48]]


def test_best_resolution_matches_transformers():
    for size in [(20, 40), (40, 24), (10, 10), (16, 48), (33, 17), (5, 90)]:
        assert select_best_resolution(size, PINPOINTS) == tuple(reference(size, PINPOINTS))


CASES = {"next_clip": ("clip", None), "next_siglip": ("siglip", None), "onevision": ("siglip", "anyres_max_9"),
         "onevision_shrunk": ("siglip", "anyres_max_1")}


def imported(case: str, tmp_path):
    """(transformers' random model of `case`, mimo's import of it)."""
    tower, aspect = CASES[case]
    torch.manual_seed(0)
    kw = dict(vision_config=tiny_vision_config(tower).to_dict(), text_config=tiny_text_config("qwen2").to_dict(),
              image_token_index=IMG, vision_feature_layer=-2, image_grid_pinpoints=PINPOINTS,
              vision_feature_select_strategy="default" if tower == "clip" else "full")
    if aspect:
        hf = transformers.LlavaOnevisionForConditionalGeneration(
            transformers.LlavaOnevisionConfig(vision_aspect_ratio=aspect, **kw))
        cfg, model = import_llava_onevision(save(perturb(hf.eval()), tmp_path / "ov"))
    else:
        hf = transformers.LlavaNextForConditionalGeneration(transformers.LlavaNextConfig(**kw))
        cfg, model = import_llava_next(save(perturb(hf.eval()), tmp_path / "next"))
    return hf, cfg, model


@pytest.mark.parametrize("case", list(CASES))
def test_import_anyres_llava_matches_transformers(case, tmp_path):
    """Three images of different sizes in one batch; anyres_max_1 shrinks every grid of more than one tile."""
    hf, cfg, model = imported(case, tmp_path)
    aspect = CASES[case][1]
    sub = model.modality_submodules["images"]
    built = build_model(cfg).modality_submodules["images"]  # the config records the tiling: the same modality
    assert (built.grid_pinpoints, built.max_tiles) == (PINPOINTS, int(aspect[len("anyres_max_"):]) if aspect else 0)
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in sub.state_dict().items()}
    sizes = torch.tensor([[20, 40], [40, 24], [12, 44]])
    tiles = [1 + r * c for r, c in (sub.tiles_of(tuple(s)) for s in sizes.tolist())]
    pixels = torch.randn(len(sizes), max(tiles), 3, 16, 16)
    flat = torch.cat([p[:t] for p, t in zip(pixels, tiles)])
    inputs = {"images": {"vit": {"pixel_values": flat, "image_sizes": sizes}}}
    with torch.no_grad():
        rows = sub(inputs["images"])
        lengths = [len(sub({"vit": {"pixel_values": flat[sum(tiles[:i]): sum(tiles[:i + 1])],
                                    "image_sizes": sizes[i:i + 1]}})) for i in range(len(sizes))]
    assert sum(lengths) == len(rows) and len(set(lengths)) > 1  # rows depend on each image's size
    ids = torch.tensor([[1] + [IMG] * n + [5, 6, 7] + [0] * (max(lengths) - n) for n in lengths])
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=pixels, image_sizes=sizes).logits
        ours = model(ids, modality_inputs=inputs).logits
    assert rel_diff(ours, ref) <= TOL


@pytest.mark.parametrize("case", list(CASES))
def test_a_prompt_of_several_images_matches_transformers(case, tmp_path):
    """A prompt of two images of different sizes, then a shorter one of one image, left-padded: LLaVA-NeXT tiles
    every image; OneVision (`batch_num_images` [2, 1]) gives each of the two its overview tile and a newline row
    only, as mimo's `tiled` flags say (tiled_images)."""
    hf, _, model = imported(case, tmp_path)
    sub = model.modality_submodules["images"]
    sizes, per_prompt = torch.tensor([[20, 40], [40, 24], [12, 44]]), [2, 1]
    tiled = tiled_images(sub.max_tiles, per_prompt)
    tiles = [1 + r * c for r, c in (sub.tiles_of(tuple(s), t) for s, t in zip(sizes.tolist(), tiled))]
    pixels = torch.randn(len(sizes), max(tiles), 3, 16, 16)
    for p, t in zip(pixels, tiles):
        p[t:] = 0  # the processor's padding
    inputs = {"vit": {"pixel_values": torch.cat([p[:t] for p, t in zip(pixels, tiles)]), "image_sizes": sizes,
                      "tiled": torch.tensor(tiled)}}
    rows = sub.rows_per_input(inputs["vit"]).tolist()
    assert len(set(rows)) == 3 if not sub.max_tiles else rows[0] == rows[1] == sub.encoders["vit"].tokens_per_image + 1
    first = [1, 5] + [IMG] * rows[0] + [7, 8] + [IMG] * rows[1] + [9]
    second = [1] + [IMG] * rows[2] + [5, 6]
    width = max(len(first), len(second))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in (first, second)])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in (first, second)])
    assert len(first) != len(second)
    extra = {"batch_num_images": torch.tensor(per_prompt)} if sub.max_tiles else {}
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes, **extra).logits
        ours = model(ids, modality_inputs={"images": inputs}, attention_mask=mask).logits
    real = mask.bool()
    assert rel_diff(ours[real], ref[real]) <= TOL


def test_a_tower_that_does_not_give_its_patch_grid_is_refused(tmp_path):
    config = transformers.LlavaNextConfig(
        vision_config=tiny_vision_config("siglip").to_dict(), text_config=tiny_text_config("qwen2").to_dict(),
        image_token_index=IMG, vision_feature_select_strategy="default", image_grid_pinpoints=PINPOINTS)
    with pytest.raises(ValueError, match="'full' for one without .SigLIP."):
        import_llava_next(save(transformers.LlavaNextForConditionalGeneration(config), tmp_path / "next"))
