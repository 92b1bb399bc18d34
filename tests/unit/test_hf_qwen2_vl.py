"""Qwen2-VL and Qwen2.5-VL in: native-resolution towers (variable patch grids, 2D RoPE, per-image attention,
Qwen2.5-VL's windows, the 2x2 merger) and M-RoPE give transformers' fp32 logits for images of several sizes and a
short video in one batch."""

import pytest
import torch

from mimo.hf.qwen2_vl import import_qwen2_vl, qwen_vl_inputs
from mimo.models.mrope import mrope_positions
from tests.support.hf_helpers import TOL, rel_diff, save
from tests.support.qwen_vl import END, IMAGE_GRIDS, IMG, PATCH_PIXELS, START, VID, VIDEO_GRIDS, batch, tiny_qwen_vl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_import_qwen_vl_matches_transformers(family, tmp_path):
    hf = tiny_qwen_vl(family)
    cfg, model = import_qwen2_vl(save(hf, tmp_path / family))
    inputs = batch()
    with torch.no_grad():
        ref = hf(**inputs).logits
        ours = model(**qwen_vl_inputs(cfg, **{k: v for k, v in inputs.items() if k != "mm_token_type_ids"})).logits
    assert rel_diff(ours, ref) <= TOL


def test_import_records_the_vision_markers_of_the_vocabulary():
    """The checkpoint's <|vision_start|> / <|vision_end|> ids land in the native table; markers the LM cannot embed
    (Qwen's defaults in a tiny checkpoint) count as none."""
    hf = tiny_qwen_vl("qwen2_vl")
    native = import_qwen2_vl(hf)[0].modalities["images"].native
    assert (native.video_token_id, native.vision_start_token_id, native.vision_end_token_id) == (VID, START, END)
    hf.config.vision_start_token_id, hf.config.vision_end_token_id = 151652, 151653
    native = import_qwen2_vl(hf)[0].modalities["images"].native
    assert (native.vision_start_token_id, native.vision_end_token_id) == (-1, -1)


def test_a_live_model_with_tied_embeddings_imports_too():
    hf = tiny_qwen_vl("qwen2_5_vl", tie=True)
    cfg, model = import_qwen2_vl(hf)
    assert cfg.llm.tie_embeddings and model.language_model.lm_head is None
    inputs = batch()
    with torch.no_grad():
        ref = hf(**inputs).logits
        ours = model(**qwen_vl_inputs(cfg, **{k: v for k, v in inputs.items() if k != "mm_token_type_ids"})).logits
    assert rel_diff(ours, ref) <= TOL


def test_mrope_positions_match_get_rope_index_with_left_padding():
    hf = tiny_qwen_vl("qwen2_5_vl")
    inputs = batch()
    ids = torch.cat([torch.zeros(2, 3, dtype=torch.long), inputs["input_ids"]], dim=1)  # left padding
    mask = (torch.arange(ids.shape[1]) >= 3).long().expand(2, -1)
    types = torch.where(ids == IMG, 1, torch.where(ids == VID, 2, 0))
    ref, _ = hf.model.get_rope_index(ids, types, inputs["image_grid_thw"], inputs["video_grid_thw"],
                                     inputs["second_per_grid_ts"], attention_mask=mask)
    grids = torch.tensor([IMAGE_GRIDS[0], VIDEO_GRIDS[0], IMAGE_GRIDS[1]])
    ours = mrope_positions(torch.where(ids == VID, IMG, ids), IMG, grids, 2, torch.tensor([1.0, 3.0, 1.0]), mask)
    assert torch.equal(ours, ref.permute(1, 2, 0))


def test_placeholders_the_grids_do_not_fill_are_refused():
    ids = torch.tensor([[1, IMG, IMG, IMG, 2]])
    with pytest.raises(ValueError, match="short of its last item"):
        mrope_positions(ids, IMG, torch.tensor([[1, 4, 4]]), 2)
    with pytest.raises(ValueError, match="more placeholders"):
        mrope_positions(ids, IMG, torch.tensor([[1, 2, 2]]), 2)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_a_row_of_two_images_of_different_sizes_matches_transformers(family):
    hf = tiny_qwen_vl(family)
    cfg, model = import_qwen2_vl(hf)
    n1, n2 = (t * h * w // 4 for t, h, w in IMAGE_GRIDS)
    ids = torch.tensor([[1, START] + [IMG] * n1 + [END, 5, START] + [IMG] * n2 + [END, 6, 7]])
    grids = torch.tensor(IMAGE_GRIDS)
    torch.manual_seed(3)
    pixels = torch.randn(int(grids.prod(-1).sum()), PATCH_PIXELS)
    with torch.no_grad():
        ref = hf(input_ids=ids, mm_token_type_ids=(ids == IMG).int(), pixel_values=pixels, image_grid_thw=grids).logits
        ours = model(**qwen_vl_inputs(cfg, ids, pixels, grids)).logits
    assert rel_diff(ours, ref) <= TOL
