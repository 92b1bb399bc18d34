"""The fused q/k/v projection computes what three linears compute, values and gradients, and is refused
where a projection is no plain linear."""

import copy

import pytest
import torch

from mimo.config.schema import AudioConfig, ViTConfig
from mimo.models.audio import AudioEncoder
from mimo.models.layers import SelfAttention, rope_cos_sin
from mimo.models.vit import VisionTransformer
from mimo.perf.fused_qkv import fuse_qkv


@pytest.mark.parametrize("bias", [True, False])
def test_fused_qkv_matches_three_projections_with_grouped_heads(bias):
    torch.manual_seed(0)
    plain = SelfAttention(32, heads=4, kv_heads=2, qkv_bias=bias, out_bias=False)
    fused = SelfAttention(32, heads=4, kv_heads=2, qkv_bias=bias, out_bias=False)
    fused.load_state_dict(plain.state_dict())
    assert fuse_qkv(fused) == 1 and fused.fused_qkv and not plain.fused_qkv
    x = torch.randn(2, 6, 32)
    rope = rope_cos_sin(torch.arange(6).expand(2, 6), 8, 10000.0)
    outs = [m(x.clone().requires_grad_(), rope=rope) for m in (plain, fused)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    grads = [torch.autograd.grad(o.square().sum(), [*m.parameters()]) for o, m in zip(outs, (plain, fused))]
    names = [n for n, _ in plain.named_parameters()]
    assert len(names) == (7 if bias else 4)  # q, k, v (and their biases), o
    for name, a, b in zip(names, *grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_fused_qkv_matches_whispers_attention_whose_key_has_no_bias():
    torch.manual_seed(0)
    encoder = AudioEncoder(AudioConfig(n_mels=8, hidden=32, layers=2, heads=4, mlp=64, max_positions=8))
    fused = copy.deepcopy(encoder)
    assert fuse_qkv(fused) == 2
    mel = torch.randn(2, 8, 16)
    outs = [m(mel) for m in (encoder, fused)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    trained = [[p for p in m.parameters() if p.requires_grad] for m in (encoder, fused)]
    grads = [torch.autograd.grad(o.square().sum(), ps) for o, ps in zip(outs, trained)]
    assert len(grads[0]) > 10
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_fuse_qkv_covers_a_vision_tower_and_refuses_a_projection_that_is_no_plain_linear():
    vit = VisionTransformer(ViTConfig(layers=2, hidden=32, heads=4, mlp=64, image=28, patch=14))
    assert fuse_qkv(vit) == 2

    class Adapted(torch.nn.Linear):  # e.g. an adapted projection, whose own forward must run
        pass

    attn = SelfAttention(32, heads=4, kv_heads=4, qkv_bias=True, out_bias=True)
    attn.k_proj = Adapted(32, 32)
    with pytest.raises(ValueError, match="q/k/v projections are neither plain nn.Linear nor column-parallel"):
        fuse_qkv(attn)
    assert not attn.fused_qkv
