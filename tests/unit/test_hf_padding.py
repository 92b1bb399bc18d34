"""Hugging Face style padding: a `[B, S]` attention mask in MimoModel's forward gives transformers' logits, and
batched left-padded greedy decoding with a KV cache gives `generate`'s tokens for prompts of different
lengths, for a causal LM and for LLaVA."""

import pytest
import torch

from mimo.hf import import_llava, import_llm
from mimo.models.generate import greedy_generate, left_pad, padded_positions
from mimo.models.multimodal import MimoModel
from tests.support.hf_generate import EOS, IMG, PAD, hf_greedy
from tests.support.hf_helpers import (
    TOL,
    perturb,
    rel_diff,
    save,
    tiny_causal_lm,
    tiny_llava,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def real_rows(mask: torch.Tensor, *logits: torch.Tensor) -> list[torch.Tensor]:
    return [x[mask.bool()] for x in logits]


@pytest.fixture
def lm_pair(tmp_path):
    hf = perturb(tiny_causal_lm("qwen2"), scale=0.3)
    return hf, MimoModel(import_llm(save(hf, tmp_path / "qwen2")), {}, {}).eval()


def test_forward_takes_a_two_dim_padding_mask(lm_pair):
    hf, model = lm_pair
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]], PAD)
    pos = padded_positions(mask)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        ours = model(ids, position_ids=pos, attention_mask=mask).logits
        ref_plain = hf(input_ids=ids, attention_mask=mask).logits
        ours_plain = model(ids, attention_mask=mask.bool()).logits
    assert rel_diff(*real_rows(mask, ours, ref)) <= TOL
    assert rel_diff(*real_rows(mask, ours_plain, ref_plain)) <= TOL
    with pytest.raises(ValueError, match="input_ids' shape"):
        model(ids, attention_mask=mask[:, 1:])


def test_left_padded_generate_matches_transformers_causal_lm(lm_pair):
    hf, model = lm_pair
    prompts = [[5, 6, 7, 8, 9, 10, 11, 20, 21], [12, 13], [15, 16, 17, 18, 19], [22]]
    ids, mask = left_pad(prompts, PAD)
    ours = greedy_generate(model, ids, None, 12, eos_id=EOS, attention_mask=mask)
    assert ours == hf_greedy(hf, ids, mask, 12)
    assert ours == [greedy_generate(model, torch.tensor([p]), None, 12, eos_id=EOS)[0] for p in prompts]


def test_left_padded_generate_matches_transformers_llava(tmp_path):
    torch.manual_seed(0)
    hf = perturb(tiny_llava("siglip", layer=-1, token=IMG), scale=0.3)
    _, model = import_llava(save(hf, tmp_path / "llava"))
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    prompts = [[1] + [IMG] * n + [5, 6, 7, 8, 9], [2] + [IMG] * n + [10], [4, 11] + [IMG] * n + [12, 13, 14]]
    ids, mask = left_pad(prompts, PAD)
    pixels = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        ours_logits = model(ids, attention_mask=mask, modality_inputs={"images": {"vit": {"pixel_values": pixels}}})
    assert rel_diff(*real_rows(mask, ours_logits.logits, ref)) <= TOL
    ours = greedy_generate(model, ids, {"images": {"vit": {"pixel_values": pixels}}}, 10, eos_id=EOS,
                           attention_mask=mask)
    assert ours == hf_greedy(hf, ids, mask, 10, pixel_values=pixels)
