"""A tiny random Qwen2-VL from transformers and a batch of images and videos in its token layout."""

import torch

from tests.support.hf_helpers import perturb, transformers

IMG, VID, START, END = 100, 101, 102, 103
PATCH_PIXELS = 3 * 2 * 4 * 4
IMAGE_GRIDS = [[1, 8, 12], [1, 4, 6]]
VIDEO_GRIDS = [[2, 4, 4]]


def tiny_qwen_vl(family: str, tie: bool = False, vocab: int = 128):
    """A random two-layer Qwen-VL LM (head_dim 16, M-RoPE sections 2/3/3) under a tower of 4-px patches."""
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                tie_word_embeddings=tie)
    common = dict(depth=3, num_heads=4, patch_size=4, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    if family == "qwen2_vl":
        vision = dict(**common, embed_dim=32, hidden_size=64, mlp_ratio=2)
        cls, config_cls = transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig
    else:  # windows of 16 px: 2 x 2 merged cells, so the 8 x 12 image has 2 x 3 windows, the 4 x 6 one ragged ones
        vision = dict(**common, hidden_size=32, out_hidden_size=64, intermediate_size=48, window_size=16,
                      fullatt_block_indexes=[1], tokens_per_second=2)
        cls, config_cls = transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig
    torch.manual_seed(0)
    config = config_cls(text_config=text, vision_config=vision, image_token_id=IMG, video_token_id=VID,
                        vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=tie)
    return perturb(cls(config).float().eval())


def batch():
    """Two rows: an 8 x 12-patch image; a 4-frame video then a 4 x 6 image; padded on the right with id 0."""
    n1, n2, nv = (t * h * w // 4 for t, h, w in (IMAGE_GRIDS[0], IMAGE_GRIDS[1], VIDEO_GRIDS[0]))
    rows = [[1, START] + [IMG] * n1 + [END, 5, 6, 7],
            [2, START] + [VID] * nv + [END, 8, START] + [IMG] * n2 + [END, 9]]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    types = torch.where(ids == IMG, 1, torch.where(ids == VID, 2, 0))
    torch.manual_seed(2)
    grids, video_grid = torch.tensor(IMAGE_GRIDS), torch.tensor(VIDEO_GRIDS)
    return dict(input_ids=ids, mm_token_type_ids=types, image_grid_thw=grids, video_grid_thw=video_grid,
                pixel_values=torch.randn(int(grids.prod(-1).sum()), PATCH_PIXELS),
                pixel_values_videos=torch.randn(int(video_grid.prod(-1).sum()), PATCH_PIXELS),
                second_per_grid_ts=torch.tensor([1.5]))
