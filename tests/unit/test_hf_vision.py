"""CLIP and SigLIP vision towers: imported weights give transformers' hidden states at every layer."""

import pytest
import torch

from mimo.hf import import_vision
from mimo.models.vit import VisionTransformer
from tests.support.hf_helpers import (
    TOL,
    perturb,
    rel_diff,
    save,
    tiny_vision_config,
    transformers,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def layer_outputs(vit: VisionTransformer, pixels: torch.Tensor) -> list[torch.Tensor]:
    """The embedding output and each block's output, like transformers' `hidden_states`."""
    x = vit.embed(pixels)
    out = [x]
    for block in vit.layers.values():
        x = block(x)
        out.append(x)
    return out


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_import_matches_transformers(family, tmp_path):
    cls = transformers.CLIPVisionModel if family == "clip" else transformers.SiglipVisionModel
    torch.manual_seed(0)
    hf = perturb(cls(tiny_vision_config(family)).eval())
    siglip = family == "siglip"
    # SigLIP's last_hidden_state carries the final LayerNorm; CLIP's has the class token and no final norm.
    vit = import_vision(save(hf, tmp_path / family), post_norm=siglip)
    assert vit.cfg.class_token != siglip and vit.cfg.patch_bias == siglip and vit.cfg.act == (
        "gelu_tanh" if siglip else "quick_gelu")
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_hidden_states=True)
        ours = vit(pixels)
        layers = layer_outputs(vit, pixels)
    assert len(layers) == len(ref.hidden_states)
    diffs = [rel_diff(a, b) for a, b in zip(layers, ref.hidden_states)] + [rel_diff(ours, ref.last_hidden_state)]
    assert max(diffs) <= TOL, diffs


def test_feature_layer_keeps_the_blocks_llava_reads():
    torch.manual_seed(0)
    hf = perturb(transformers.CLIPVisionModel(tiny_vision_config("clip")).eval())
    vit = import_vision(hf, feature_layer=-2, drop_class_token=True)
    assert len(vit.layers) == 2 and vit.tokens_per_image == 16
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_hidden_states=True).hidden_states[-2][:, 1:]
        assert rel_diff(vit(pixels), ref) <= TOL
