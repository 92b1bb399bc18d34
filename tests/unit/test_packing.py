"""Sequence packing: the packed batch's structure and its equality with unpacked training.

The packed and the padded batch hold the same samples, so a packed step must reproduce the padded
step: same loss-token count, loss and gradients (single process here; every CP/TP layout in
test_context_parallel)."""

import pytest
import torch

from mimo.config.schema import ModalityConfig, ModelConfig, ViTConfig
from mimo.data.batching import COUNTS
from mimo.data.packing import first_fit, pack_batch, sample_lengths
from mimo.models.build import build_model
from mimo.models.layers import document_mask
from mimo.models.step_hints import forward_args
from tests.support.configs import tiny_llm

PAD, IMG = 0, 60


def _batch() -> dict:
    """Three padded samples of lengths 5, 7 and 3 holding 1, 0 and 2 images (one token each)."""
    ids = torch.tensor([[1, IMG, 3, 4, 5, PAD, PAD, PAD],
                        [6, 7, 8, 9, 10, 11, 12, PAD],
                        [IMG, IMG, 13, PAD, PAD, PAD, PAD, PAD]])
    labels = torch.full_like(ids, -100)
    labels[0, 1:4] = torch.tensor([3, 4, 5])
    labels[1, 0:6] = torch.tensor([7, 8, 9, 10, 11, 12])
    labels[2, 1:3] = torch.tensor([13, 14])
    pixels = torch.arange(3.0)[:, None, None, None].expand(3, 3, 4, 4).contiguous()
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(8).expand(3, 8).contiguous(),
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}},
            COUNTS: {"images": torch.tensor([1, 0, 2])}}


def test_first_fit_and_lengths():
    assert first_fit([5, 7, 3, 4, 2], 10) == [[0, 2, 4], [1], [3]]
    b = _batch()
    assert sample_lengths(b["input_ids"], b["labels"], PAD).tolist() == [5, 7, 3]
    with pytest.raises(ValueError, match="does not fit data.pack_length = 6; raise data.pack_length to at least 7"):
        first_fit([5, 7], 6)


def test_pack_batch_layout():
    packed, stats = pack_batch(_batch(), PAD, 10, row_multiple=4)
    assert packed["input_ids"].tolist() == [[1, IMG, 3, 4, 5, IMG, IMG, 13, PAD, PAD],
                                            [6, 7, 8, 9, 10, 11, 12, PAD, PAD, PAD], [PAD] * 10, [PAD] * 10]
    assert packed["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]
    assert packed["labels"][0].tolist() == [-100, 3, 4, 5, -100, -100, 13, 14, -100, -100]
    assert packed[COUNTS]["images"].tolist() == [3, 0, 0, 0]
    # images follow their samples: sample 0's image, then sample 2's two
    assert packed["modality_inputs"]["images"]["vit"]["pixel_values"][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]
    assert packed["document_ids"][0].tolist() == [0] * 5 + [1, 1, 1] + [2, 2]  # padding is a document of its own
    assert "attention_mask" not in packed  # the model builds it from document_ids, where its tensors live
    positions = torch.arange(10)
    mask = document_mask(packed["document_ids"], positions)[0, 0]
    assert mask[6].tolist() == [False] * 5 + [True, True] + [False] * 3  # a document sees only itself, causally
    assert mask[9].tolist() == [False] * 8 + [True, True]
    assert (stats.real, stats.unpacked, stats.packed) == (15, 24, 40)
    assert document_mask(torch.zeros(1, 3, dtype=torch.long), torch.arange(3))[0, 0].equal(
        torch.ones(3, 3, dtype=torch.bool).tril())
    # keys in another order (context parallel's gathered order): still causal by row position
    order = torch.tensor([2, 0, 1])
    shuffled = document_mask(torch.zeros(1, 3, dtype=torch.long), torch.arange(3), torch.zeros(1, 3, dtype=torch.long),
                             order)[0, 0]
    assert shuffled.equal(torch.ones(3, 3, dtype=torch.bool).tril()[:, order])
    with pytest.raises(ValueError, match="cannot pack batch entries"):
        pack_batch({**_batch(), "attention_mask": torch.ones(1)}, PAD, 10)


def _grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_packed_step_equals_padded_step():
    torch.manual_seed(0)
    model = build_model(ModelConfig(
        llm=tiny_llm(init_std=0.1),
        modalities={"images": ModalityConfig(token_id=IMG, vit=ViTConfig(image=4, patch=4, hidden=16, layers=1,
                                                                         heads=4, mlp=32, init_std=0.1))}))
    results = []
    for batch in (_batch(), pack_batch(_batch(), PAD, 10)[0]):
        model.zero_grad()
        out = model(**forward_args({k: v for k, v in batch.items() if k != COUNTS}))
        (out.loss_sum / out.num_tokens).backward()
        results.append((out.num_tokens, out.loss_sum.detach(), _grads(model)))
    (n_ref, loss_ref, g_ref), (n, loss, g) = results
    assert n == n_ref == 11
    assert abs(loss - loss_ref) <= 1e-5 * abs(loss_ref)
    assert g.keys() == g_ref.keys()
    largest = max(ref.abs().max() for ref in g_ref.values())
    for name, ref in g_ref.items():
        # A key bias shifts every logit of a query equally, so its exact gradient is zero and what both
        # paths compute is rounding noise: bound it against the largest gradient instead.
        bound = 1e-6 * largest if name.endswith("k_proj.bias") else 1e-5 * ref.abs().max()
        assert (g[name] - ref).abs().max() <= bound, name
    packed = {k: v for k, v in pack_batch(_batch(), PAD, 10)[0].items() if k != COUNTS}
    with pytest.raises(ValueError, match="pass attention_mask or document_ids, not both"):
        model(**forward_args(packed), attention_mask=torch.ones(4, 1, 10, 10, dtype=torch.bool))
