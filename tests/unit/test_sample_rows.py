"""`leading_rows` keeps each entry's first `counts[i]` rows of a padded `[n, K, ...]` tensor, in order, and
`leading_row_index` names the same rows of its flattened view; both refuse a count past K or a count per entry
missing."""

import pytest
import torch

from mimo.models.sample_rows import leading_row_index, leading_rows


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
