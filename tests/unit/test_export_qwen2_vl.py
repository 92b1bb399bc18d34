"""Qwen-VL out: an imported checkpoint exported again, and a mimo-built native-resolution model, load in
transformers with the same fp32 logits (images of two sizes and a video in one batch); the vision markers' ids
survive the round trip and are named in an exported tokenizer."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.export import export_qwen2_vl
from mimo.hf.qwen2_vl import import_qwen2_vl, qwen_vl_inputs
from mimo.models.build import build_model
from mimo.models.mrope import mrope_positions
from mimo.models.step_hints import forward_args
from tests.support.configs import CONFIGS, tiny_native_vlm
from tests.support.hf_helpers import TOL, rel_diff, transformers
from tests.support.native_data import TINY
from tests.support.qwen_vl import END, IMG, START, VID, batch, tiny_qwen_vl

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


@pytest.mark.parametrize("family", list(CLASSES))
def test_import_then_export_reloads_with_the_same_logits(family, tmp_path):
    hf = tiny_qwen_vl(family)
    _, model = import_qwen2_vl(hf)
    again = getattr(transformers, CLASSES[family]).from_pretrained(export_qwen2_vl(model, tmp_path / "out")).eval()
    ids = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    assert [getattr(again.config, k) for k in ids] == [IMG, VID, START, END]
    inputs = batch()
    with torch.no_grad():
        assert rel_diff(again(**inputs).logits, hf(**inputs).logits) <= TOL


@pytest.mark.parametrize("family", list(CLASSES))
def test_a_mimo_model_exports_to_transformers(family, tmp_path):
    torch.manual_seed(0)
    cfg = tiny_native_vlm(family=family, act="silu" if family == "qwen2_5_vl" else "quick_gelu")
    model = build_model(cfg).eval()
    hf = getattr(transformers, CLASSES[family]).from_pretrained(export_qwen2_vl(model, tmp_path / "out")).eval()
    assert (hf.config.vision_start_token_id, hf.config.vision_end_token_id) == (-1, -1)  # built without markers
    grids = torch.tensor([[1, 8, 4], [1, 4, 4]])
    ids = torch.tensor([[1, 2] + [60] * 8 + [3, 4, 5, 6], [7] + [60] * 4 + [8, 9, 10, 11, 12, 13, 14, 15, 16]])
    pixels = torch.randn(48, 3 * 2 * 4 * 4)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=pixels, image_grid_thw=grids, mm_token_type_ids=(ids == 60).int()).logits
        mine = qwen_vl_inputs(cfg, ids, pixels, grids)
        assert torch.equal(mine["position_ids"], mrope_positions(ids, 60, grids, 2))
        ours = model(**forward_args(mine)).logits
    assert rel_diff(ours, ref) <= TOL


def test_the_vision_markers_are_named_in_the_exported_tokenizer(tmp_path):
    """A run's markers (here 263 and 262, above the byte tokenizer's ids) become Qwen2-VL's <|vision_start|> and
    <|vision_end|> in the exported tokenizer and config; an id the tokenizer holds already is refused."""
    native = "--model.modalities.images.native"
    marks = [f"{native}.vision_start_token_id=263", f"{native}.vision_end_token_id=262"]
    model = build_model(load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *marks]).model)
    out = export_qwen2_vl(model, tmp_path / "out", tokenizer="byte")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"]) == [263, 262]
    assert tok("<|vision_start|>hi<|vision_end|>").input_ids == [256, 263, *b"hi", 262]
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (263, 262)
    model = build_model(load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, f"{native}.vision_start_token_id=258",
                                                                          f"{native}.vision_end_token_id=262"]).model)
    with pytest.raises(ValueError, match=r"tokenizer 'byte' holds '<\|pad\|>' at id 258, where the model has "
                                         r"'<\|vision_start\|>'"):
        export_qwen2_vl(model, tmp_path / "refused", tokenizer="byte")
