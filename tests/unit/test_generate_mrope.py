"""Greedy decoding of an imported Qwen2-VL / Qwen2.5-VL (M-RoPE positions for the prompt's images and video, new
tokens past each row's largest position) gives transformers' `generate(do_sample=False)` tokens, for one image+text
prompt and for a left-padded batch of prompts of different lengths.

A prompt that ends on an image's placeholders is where transformers 5's `generate` parts from Qwen2-VL's rope_deltas
(it steps each axis past the last token's own position, not past the largest): there the oracle is transformers'
forward over the prompt and the answer together, whose positions get_rope_index gives (the answer as text after
the image, as training sees it).
"""

import pytest
import torch

from mimo.hf.qwen2_vl import import_qwen2_vl, qwen_vl_inputs
from mimo.models.generate import greedy_generate, left_pad, next_positions
from tests.support.qwen_vl import END, IMAGE_GRIDS, IMG, PATCH_PIXELS, START, VID, VIDEO_GRIDS, tiny_qwen_vl

pytestmark = pytest.mark.usefixtures("one_thread")

EOS, PAD, STEPS = 3, 0, 12


def prompts() -> tuple[list[list[int]], dict]:
    """An 8 x 12-patch image then text; a video, text, a 4 x 6 image and text; text then a 4 x 6 image that ends
    the prompt (its last row's position is not the largest); and the grids and pixels of their items."""
    n1, n2, nv = (t * h * w // 4 for t, h, w in (IMAGE_GRIDS[0], IMAGE_GRIDS[1], VIDEO_GRIDS[0]))
    rows = [[1, START] + [IMG] * n1 + [END, 5, 6, 7],
            [2, START] + [VID] * nv + [END, 8, START] + [IMG] * n2 + [END, 9],
            [4, 12, 13, START] + [IMG] * n2]
    grids = torch.tensor([IMAGE_GRIDS[0], IMAGE_GRIDS[1], IMAGE_GRIDS[1]])
    torch.manual_seed(2)
    media = dict(image_grid_thw=grids, video_grid_thw=torch.tensor(VIDEO_GRIDS),
                 pixel_values=torch.randn(int(grids.prod(-1).sum()), PATCH_PIXELS),
                 pixel_values_videos=torch.randn(int(torch.tensor(VIDEO_GRIDS).prod(-1).sum()), PATCH_PIXELS),
                 second_per_grid_ts=torch.tensor([1.5]))
    return rows, media


def hf_greedy(hf, ids, mask, media) -> list[list[int]]:
    types = torch.where(ids == IMG, 1, torch.where(ids == VID, 2, 0)) * mask
    if hf.config.model_type == "qwen2_vl":  # which has no temporal scale
        media = {k: v for k, v in media.items() if k != "second_per_grid_ts"}
    out = hf.generate(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, max_new_tokens=STEPS,
                      do_sample=False, eos_token_id=EOS, pad_token_id=PAD, **media)[:, ids.shape[1]:].tolist()
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in out]


def ours_greedy(cfg, model, ids, mask, media, use_cache=True) -> list[list[int]]:
    inputs = qwen_vl_inputs(cfg, ids, attention_mask=mask, **media)
    return greedy_generate(model, inputs["input_ids"], inputs.get("modality_inputs"), STEPS, EOS, use_cache=use_cache,
                           attention_mask=mask, position_ids=inputs["position_ids"])


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def pair(request):
    hf = tiny_qwen_vl(request.param)
    return hf, import_qwen2_vl(hf)


def test_one_image_prompt_decodes_as_transformers(pair):
    hf, (cfg, model) = pair
    rows, media = prompts()
    ids = torch.tensor(rows[:1])
    one = {"image_grid_thw": media["image_grid_thw"][:1],
           "pixel_values": media["pixel_values"][: int(media["image_grid_thw"][0].prod())]}
    mask = torch.ones_like(ids)
    ref = hf_greedy(hf, ids, mask, one)
    assert len(ref[0]) == STEPS and not set(ref[0]) & {IMG, VID}  # a long answer of ordinary tokens
    assert ours_greedy(cfg, model, ids, mask, one) == ref


def test_a_left_padded_batch_decodes_as_transformers(pair):
    hf, (cfg, model) = pair
    rows, media = prompts()
    rows[2] = [6, 7, 8, 9]  # text alone
    media = {k: v[:-1] if k == "image_grid_thw" else v for k, v in media.items()}
    media["pixel_values"] = media["pixel_values"][: int(media["image_grid_thw"].prod(-1).sum())]
    ids, mask = left_pad(rows, PAD)
    ref = hf_greedy(hf, ids, mask, media)
    assert ours_greedy(cfg, model, ids, mask, media) == ref
    assert ours_greedy(cfg, model, ids, mask, media, use_cache=False) == ref


def test_a_prompt_ending_on_an_image_decodes_as_transformers_reads_the_answer(pair):
    """Each new token is transformers' greedy choice at its place in the prompt-and-answer sequence."""
    hf, (cfg, model) = pair
    rows, media = prompts()
    ids, mask = left_pad(rows, PAD)
    ours = ours_greedy(cfg, model, ids, mask, media)
    assert all(len(o) == STEPS and not set(o) & {IMG, VID, START, END} for o in ours)  # ordinary answers
    full = torch.cat([ids, torch.tensor(ours)], dim=1)
    full_mask = torch.cat([mask, torch.ones(len(rows), STEPS, dtype=torch.long)], dim=1)
    types = torch.where(full == IMG, 1, torch.where(full == VID, 2, 0)) * full_mask
    if hf.config.model_type == "qwen2_vl":
        media = {k: v for k, v in media.items() if k != "second_per_grid_ts"}
    with torch.no_grad():
        logits = hf(input_ids=full, attention_mask=full_mask, mm_token_type_ids=types, **media).logits
    assert logits[:, ids.shape[1] - 1: -1].argmax(-1).tolist() == ours


def test_new_tokens_start_past_the_largest_prompt_position():
    positions = torch.tensor([[[0, 0, 0], [0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 3], [2, 3, 2], [2, 3, 3]]])
    mask = torch.ones(1, 7, dtype=torch.long)
    assert next_positions(positions, mask).tolist() == [4]
    mask[0, :2] = 0  # padding's positions do not count
    assert next_positions(torch.tensor([[9, 9, 0, 1, 2, 3, 4]]), mask).tolist() == [5]
