"""ModalitySubmodules: encode accepts the encoder output forms, combine, project; MimoModel errors."""

import pytest
import torch
from torch import nn

from mimo.models.llm import DecoderLM
from mimo.models.multimodal import MimoModel, ModalitySubmodules
from tests.support.configs import tiny_llm


class Fixed(nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.form = form

    def forward(self, x: torch.Tensor):
        if self.form == "3d":
            return x  # [b, s, h]
        if self.form == "2d":
            return x.reshape(-1, x.shape[-1])
        if self.form == "tuple":
            return x, {"aux": 1}
        return x[None]


@pytest.mark.parametrize("form", ["3d", "2d", "tuple"])
def test_encode_flattens_every_output_form(form):
    sub = ModalitySubmodules(encoders={"e": Fixed(form)})
    x = torch.randn(2, 3, 4)
    (rows,) = sub.encode({"e": {"x": x}})
    assert torch.equal(rows, x.reshape(6, 4))


def test_encode_rejects_other_ranks_and_missing_inputs():
    sub = ModalitySubmodules(encoders={"e": Fixed("4d")})
    with pytest.raises(ValueError, match="4-D tensor"):
        sub.encode({"e": {"x": torch.randn(2, 3, 4)}})
    with pytest.raises(ValueError, match="no inputs for encoder 'e'"):
        sub.encode({"other": {"x": torch.randn(1)}})


def test_combine_concatenates_in_registration_order_and_projects():
    proj = nn.Linear(4, 5)
    sub = ModalitySubmodules(encoders={"b": Fixed("3d"), "a": Fixed("2d")}, input_projections=[proj])
    xb, xa = torch.randn(1, 2, 4), torch.randn(3, 1, 4)
    rows = sub.encode({"a": {"x": xa}, "b": {"x": xb}})
    combined = sub.combine(rows)
    assert torch.equal(combined, torch.cat([xb.reshape(2, 4), xa.reshape(3, 4)]))
    assert sub.combine(rows[:1]) is rows[0]
    with pytest.raises(ValueError, match="empty list"):
        sub.combine([])
    assert torch.allclose(sub({"a": {"x": xa}, "b": {"x": xb}}), proj(combined))


def _tiny_model() -> MimoModel:
    lm = DecoderLM(tiny_llm(hidden=8, layers=1, heads=2, kv_heads=1, mlp=16))
    sub = ModalitySubmodules(encoders={"e": Fixed("3d")}, input_projections=[nn.Linear(4, 8)])
    return MimoModel(lm, {"images": sub}, {"images": 60})


def test_placeholder_without_input_is_an_error():
    model = _tiny_model()
    ids = torch.tensor([[1, 60, 2]])
    with pytest.raises(ValueError, match="placeholder tokens of 'images'"):
        model(ids)
    out = model(torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, 64)


def test_modality_without_token_id_is_an_error():
    lm = DecoderLM(tiny_llm(hidden=8, layers=1, heads=2, kv_heads=1, mlp=16))
    with pytest.raises(ValueError, match="no placeholder token id"):
        MimoModel(lm, {"images": ModalitySubmodules()}, {})


def test_forward_with_image_and_loss():
    model = _tiny_model()
    ids = torch.tensor([[1, 60, 60, 2], [60, 60, 3, 4]])
    labels = torch.tensor([[-100, -100, 5, 6], [-100, -100, -100, 7]])
    out = model(ids, labels=labels, modality_inputs={"images": {"e": {"x": torch.randn(2, 2, 4)}}})
    assert out.num_tokens.item() == 3
    assert out.loss_sum.requires_grad
    with pytest.raises(ValueError, match="unknown modalities"):
        model(ids, modality_inputs={"video": {}})
