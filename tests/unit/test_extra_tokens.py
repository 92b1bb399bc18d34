"""`model.llm.extra_tokens` on one process, against `transformers`: the grown embedding equals what
`resize_token_embeddings` makes (old rows as they are, new rows its mean-resizing draw), the gate names the key
where a tokenizer writing every id leaves no placeholder, and a trained run exports to a LLaVA directory and an LM
that load in transformers with mimo's logits and a tokenizer holding `<image>` at its new id."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mimo.config.schema import ConfigError
from mimo.export import export_run
from mimo.hf.build import build_model, new_rows_seed
from mimo.hf.grow import mean_resized_rows
from mimo.models.init import parameter_seed
from mimo.train.checkpoint.weights import load_run
from mimo.train.gate import validate_run
from mimo.train.trainer import Trainer
from tests.support.full_vocab import VOCAB, full_vocab_overrides, full_vocab_run
from tests.support.hf_helpers import PIL, TOL, compare, rel_diff, transformers
from tests.support.tiny_run import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    return full_vocab_run(tmp_path_factory.mktemp("full_vocab"))


def _config(tmp_path, run_files, *overrides):
    return tiny_config(tmp_path, *full_vocab_overrides(*run_files), *overrides)


def test_new_rows_are_what_resize_token_embeddings_makes(tmp_path, run_files):
    lm_dir, _ = run_files
    torch.manual_seed(0)
    model = build_model(_config(tmp_path, run_files, '--model.llm.extra_tokens=["<image>", "<video>"]').model)
    lm, seed = model.language_model, new_rows_seed(model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    old_head = hf.lm_head
    torch.manual_seed(parameter_seed(seed, "embed_tokens.weight"))
    hf.resize_token_embeddings(VOCAB + 2)  # mean_resizing, the default; the embedding draws first
    assert lm.embed_tokens.weight.shape == (VOCAB + 2, 32)
    assert torch.equal(lm.embed_tokens.weight.detach(), hf.model.embed_tokens.weight.detach())
    # The untied head draws with a seed of its own: as transformers' resize of the head alone, seeded with it.
    torch.manual_seed(parameter_seed(seed, "lm_head.weight"))
    head = hf._get_resized_lm_head(old_head, VOCAB + 2).weight.detach()
    assert torch.equal(lm.lm_head.weight.detach(), head)
    assert torch.equal(head[:VOCAB], old_head.weight.detach())
    assert 0 < (head[VOCAB:] - old_head.weight.mean(0)).abs().max() < 1e-3 * old_head.weight.std(0).max()


def test_a_rank_deficient_covariance_gives_the_mean():
    old = torch.randn(4, 8)  # 4 rows span at most 4 of 8 dimensions: transformers falls back to the mean
    assert torch.equal(mean_resized_rows(old, 3, 0), old.mean(0).expand(3, 8))


def test_the_gate_names_the_key_where_no_id_is_free(tmp_path, run_files):
    plain = [o for o in full_vocab_overrides(*run_files) if "extra_tokens" not in o]
    fix = r'model.llm.extra_tokens = \["<image>"\] and token_id = 63'
    with pytest.raises(ConfigError, match=f"token_id \\(0\\) is an id the tokenizer .* writes for text.*{fix}"):
        validate_run(tiny_config(tmp_path, *plain, "--model.modalities.images.token_id=0"), 1)
    with pytest.raises(ConfigError, match=rf"token_id \(63\) must lie in \[0, 63\).*{fix}"):
        validate_run(tiny_config(tmp_path, *plain), 1)
    with pytest.raises(ConfigError, match="extra_tokens grows the vocabulary of a pretrained LM"):
        validate_run(tiny_config(tmp_path, '--model.llm.extra_tokens=["<image>"]'), 1)
    with pytest.raises(ConfigError, match="names '<image>' more than once"):
        validate_run(_config(tmp_path, run_files, '--model.llm.extra_tokens=["<image>", "<image>"]'), 1)
    with pytest.raises(ConfigError, match="already has '<s>' at id 1; drop it from model.llm.extra_tokens"):
        validate_run(_config(tmp_path, run_files, '--model.llm.extra_tokens=["<image>", "<s>"]'), 1)
    with pytest.raises(ConfigError, match="writes text with the byte tokenizer"):
        validate_run(_config(tmp_path, run_files, "--data.name=shapes"), 1)
    two = ["--model.llm.extra_tokens=[\"<image>\", \"<video>\"]", "--parallel.modules.language.tp=2"]
    with pytest.raises(ConfigError, match=r"vocab \(65\) must be divisible by the LM's tp \(2\).*add 1 unused tokens"):
        validate_run(_config(tmp_path, run_files, *two), 2)
    validate_run(_config(tmp_path, run_files, "--parallel.modules.language.tp=2"), 2)


@pytest.mark.parametrize("tie", [False, True])
def test_the_export_loads_in_transformers_with_the_new_token(tmp_path, tie):
    lm_dir, manifest = full_vocab_run(tmp_path / "src", tie=tie)
    Trainer(tiny_config(tmp_path, *full_vocab_overrides(lm_dir, manifest), "--train.steps=2")).train()
    _, model = load_run(tmp_path / "tiny")
    out = export_run(tmp_path / "tiny", tmp_path / "llava")
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(out).eval()
    assert hf.config.text_config.vocab_size == VOCAB + 1 and hf.config.image_token_index == VOCAB
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    ids = torch.tensor([[1] + [VOCAB] * n + [5, 6, 7], [1] + [VOCAB] * n + [8, 9, 10]])
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model(ids, modality_inputs={"images": {"vit": {"pixel_values": pixels}}}).logits
        assert ours.shape[-1] == VOCAB + 1
        assert rel_diff(ours, hf(input_ids=ids, pixel_values=pixels).logits) <= TOL
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<image>") == VOCAB and len(tok) == VOCAB + 1
    assert tok.encode("what<image>is", add_special_tokens=False)[1] == VOCAB  # not split by the pre-tokenizer
    processor = transformers.AutoProcessor.from_pretrained(out, **PIL)
    batch = processor(text="<image>\nwhat", images=Image.new("RGB", (40, 40)), return_tensors="pt")
    assert int((batch["input_ids"] == VOCAB).sum()) == n
    causal = transformers.AutoModelForCausalLM.from_pretrained(export_run(tmp_path / "tiny", tmp_path / "lm",
                                                                          lm_only=True)).eval()
    assert causal.config.vocab_size == VOCAB + 1
    assert max(compare(model.language_model, causal)) <= TOL


def test_a_resumed_run_keeps_the_new_rows(tmp_path, run_files):
    straight = Trainer(_config(tmp_path / "a", run_files, "--train.steps=4"))
    straight.train()
    Trainer(_config(tmp_path / "b", run_files, "--train.steps=2", "--checkpoint.save_every=2")).train()
    resumed = Trainer(_config(tmp_path / "b", run_files, "--train.steps=4", "--checkpoint.resume=true"))
    assert resumed.checkpointer.resume() == 2
    resumed.train()
    for name in ("embed_tokens.weight", "lm_head.weight"):
        ours, ref = (getattr(t.model.language_model, name.split(".")[0]).weight for t in (resumed, straight))
        assert ours.shape[0] == VOCAB + 1 and torch.allclose(ours, ref, rtol=1e-6, atol=1e-6), name
