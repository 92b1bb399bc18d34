"""`leading_rows` keeps each entry's first `counts[i]` rows of a padded `[n, K, ...]` tensor, in order, and
`leading_row_index` names the same rows of its flattened view; both refuse a count past K or a count per entry
missing. `fed_modalities` names a batch's modalities with at least one input; `MimoModel.unfed_parameters` what
a step leaves untrained on a batch that feeds none of a modality: its encoders and input projections."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.models.build import build_model
from mimo.models.sample_rows import fed_modalities, leading_row_index, leading_rows
from tests.support.configs import T2I, TINY_T2I


def test_leading_rows_keeps_each_entrys_first_rows():
    x = torch.arange(3 * 4 * 2).view(3, 4, 2)
    counts = torch.tensor([2, 0, 4])
    expected = torch.tensor([[0, 1], [2, 3], [16, 17], [18, 19], [20, 21], [22, 23]])  # by hand
    assert torch.equal(leading_rows(x, counts, "x"), expected)
    assert leading_row_index(x.shape, counts, "x").tolist() == [0, 1, 8, 9, 10, 11]


def test_leading_rows_refuses_bad_counts():
    x = torch.zeros(2, 3, 1)
    with pytest.raises(ValueError, match="needs 4 rows but only 3"):
        leading_rows(x, torch.tensor([1, 4]), "x")
    with pytest.raises(ValueError, match="one count per entry"):
        leading_rows(x, torch.tensor([1]), "x")
    with pytest.raises(ValueError, match="one count per entry"):
        leading_rows(torch.zeros(2, 3), torch.tensor([1, 1]), "x")


def test_fed_modalities_are_those_with_an_input():
    one, none = torch.zeros(1, 3, 8, 8), torch.zeros(0, 3, 8, 8)
    inputs = {"images": {"vit": {"pixel_values": one}}, "audio": {"audio": {"features": torch.zeros(0, 4),
                                                                           "output_lengths": torch.zeros(0)}}}
    assert fed_modalities(inputs) == {"images"}
    assert fed_modalities({"images": {"vit": {"pixel_values": none}}}) == set()
    assert fed_modalities(None) == fed_modalities({}) == set()


def test_an_unfed_modality_leaves_its_encoders_and_input_projections():
    model = build_model(load_config(T2I, TINY_T2I).model)
    images = model.modality_submodules["images"]
    expected = {id(p) for part in (images.encoders, images.input_projections) for p in part.parameters()}
    assert {id(p) for p in model.unfed_parameters(set())} == expected
    assert model.unfed_parameters({"images"}) == []
