"""Embedding alignment: rows land at their placeholders in batch-major order; both paths agree."""

import pytest
import torch

from mimo.models.multimodal import align_embeddings, align_embeddings_by_index, text_positions, token_indices

H = 8
IMG, AUD = 50, 51


def _marked_rows(n: int, base: float) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)[:, None] + base + torch.zeros(n, H)


def test_one_modality_lands_batch_major():
    ids = torch.tensor([[1, IMG, 2, 3], [IMG, 4, 5, IMG]])
    text = _marked_rows(5, 100.0)
    img = _marked_rows(3, 10.0)
    out = align_embeddings(text, {"images": img}, ids, {"images": IMG})
    assert out.shape == (2, 4, H)
    assert out[0, 1, 0] == 10 and out[1, 0, 0] == 11 and out[1, 3, 0] == 12
    assert [out[0, 0, 0].item(), out[0, 2, 0].item(), out[0, 3, 0].item()] == [100, 101, 102]
    assert [out[1, 1, 0].item(), out[1, 2, 0].item()] == [103, 104]


def test_several_modalities():
    ids = torch.tensor([[IMG, 1, AUD, AUD], [2, AUD, IMG, IMG]])
    out = align_embeddings(_marked_rows(2, 100.0), {"images": _marked_rows(3, 10.0), "audio": _marked_rows(3, 20.0)},
                           ids, {"images": IMG, "audio": AUD})
    assert out[:, :, 0].tolist() == [[10, 100, 20, 21], [101, 22, 11, 12]]


def test_images_of_different_lengths_per_sample():
    # sample 0: two images of 3 and 2 tokens; sample 1: one image of 4 tokens
    ids = torch.tensor([[1, IMG, IMG, IMG, 2, IMG, IMG, 3], [4, 5, IMG, IMG, IMG, IMG, 6, 7]])
    img = torch.cat([_marked_rows(3, 10.0), _marked_rows(2, 20.0), _marked_rows(4, 30.0)])
    out = align_embeddings(_marked_rows(7, 100.0), {"images": img}, ids, {"images": IMG})
    assert out[0, :, 0].tolist() == [100, 10, 11, 12, 101, 20, 21, 102]
    assert out[1, :, 0].tolist() == [103, 104, 30, 31, 32, 33, 105, 106]


def test_count_mismatch_errors():
    ids = torch.tensor([[1, IMG, IMG, 2]])
    with pytest.raises(ValueError, match=r"Number of images tokens \(2\) does not match number of images "
                                         r"embeddings \(3\)"):
        align_embeddings(_marked_rows(2, 0.0), {"images": _marked_rows(3, 0.0)}, ids, {"images": IMG})
    with pytest.raises(ValueError, match=r"Number of text tokens \(2\) does not match"):
        align_embeddings(_marked_rows(1, 0.0), {"images": _marked_rows(2, 0.0)}, ids, {"images": IMG})


def test_missing_placeholder_id():
    ids = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="No special token ID defined for modality video"):
        align_embeddings(_marked_rows(2, 0.0), {"video": _marked_rows(0, 0.0)}, ids, {})


def test_index_path_equals_mask_path_bitwise():
    torch.manual_seed(0)
    ids = torch.randint(0, 40, (3, 9))
    ids[0, 2:5] = IMG
    ids[1, 0] = AUD
    ids[2, 6:9] = IMG
    ids[2, 1] = AUD
    tok = {"images": IMG, "audio": AUD}
    emb = torch.nn.Embedding(64, H)
    img = torch.randn(6, H, requires_grad=True)
    aud = torch.randn(2, H, requires_grad=True)
    grad_out = torch.randn(3, 9, H)

    def run(path: str):
        emb.zero_grad()
        img.grad = aud.grad = None
        if path == "mask":
            text = emb(ids[text_positions(ids, tok)])
            out = align_embeddings(text, {"images": img, "audio": aud}, ids, tok)
        else:
            idx = token_indices(ids, tok)
            text = emb(ids.reshape(-1).index_select(0, idx["text"]))
            out = align_embeddings_by_index(text, {"images": img, "audio": aud}, idx, *ids.shape)
        out.backward(grad_out)
        return out.detach(), emb.weight.grad.clone(), img.grad.clone(), aud.grad.clone()

    for a, b in zip(run("mask"), run("index")):
        assert torch.equal(a, b)


def test_index_path_validation():
    ids = torch.tensor([[1, IMG, 2, 3]])
    idx = token_indices(ids, {"images": IMG})
    text, img = torch.zeros(3, H), torch.zeros(1, H)
    with pytest.raises(ValueError, match="same modalities"):
        align_embeddings_by_index(text, {"images": img}, {"text": idx["text"]}, 1, 4)
    with pytest.raises(ValueError, match="must be one-dimensional"):
        align_embeddings_by_index(text, {"images": img}, {**idx, "images": idx["images"][None]}, 1, 4)
    with pytest.raises(ValueError, match=r"Number of images token indices \(0\)"):
        align_embeddings_by_index(text, {"images": img}, {**idx, "images": idx["images"][:0]}, 1, 4)
    with pytest.raises(ValueError, match="must cover B\\*S = 4 positions, got 3"):
        align_embeddings_by_index(text[:2], {"images": img}, {**idx, "text": idx["text"][:2]}, 1, 4)
