"""The Out path: LM states at generation tokens -> output projection -> patch decoder -> a loss that trains.

Covers the decoder loss against a hand computation and finite differences, the per-token normalisation
(any microbatch split gives the same gradients), batches where only some samples generate, the
text-to-image data and CLI, and the config checks.
"""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.cli import main as cli_main
from mimo.config.load import dump_toml, load_config
from mimo.config.schema import ConfigError, DecoderConfig, ModalityConfig, ModelConfig, ViTConfig
from mimo.data.batching import split_microbatches
from mimo.data.text_to_image import TextToImageData
from mimo.eval.text_to_image import judge_recognises, train_judge
from mimo.models.build import build_model
from mimo.models.decoders import image_to_patches, patches_to_image
from mimo.models.out_loss import OutPathLoss
from mimo.models.step_hints import forward_args
from mimo.parallel import layout_rules
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import tiny_llm

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")

GEN, IMG, PAD = 61, 60, 0
DEC = DecoderConfig(image=8, patch=4, channels=3, hidden=16, layers=1, heads=2, mlp=32, init_std=0.2)


def tiny_model(weight: float = 1.0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    cfg = ModelConfig(llm=tiny_llm(hidden=16, layers=1, heads=2, kv_heads=1, mlp=32, init_std=0.2),
                      modalities={"images": ModalityConfig(token_id=IMG, vit=ViTConfig(image=8, patch=4, hidden=8,
                                                                                       layers=1, heads=2, mlp=16),
                                                           output_token_id=GEN, output_loss_weight=weight,
                                                           decoder=DEC)})
    return cfg, build_model(cfg).to(dtype)


def batch(gen_per_sample: list[int], seq: int = 12) -> dict:
    """Samples with 0 or 4 generation tokens (one 8x8 image of 2x2 patches) after a short prompt."""
    g = torch.Generator().manual_seed(1)
    b = len(gen_per_sample)
    ids = torch.randint(1, 50, (b, seq), generator=g)
    labels = torch.randint(1, 50, (b, seq), generator=g)
    for i, n in enumerate(gen_per_sample):
        ids[i, 3 : 3 + n] = GEN
    targets = torch.rand(b, 4, 48, generator=g) * 2 - 1
    return {"input_ids": ids, "labels": labels, "modality_targets": {"images": targets}}


def test_patches_round_trip():
    x = torch.randn(2, 3, 8, 8)
    p = image_to_patches(x, 4)
    assert p.shape == (2, 4, 48)
    assert torch.equal(p[0, 1], x[0, :, 0:4, 4:8].reshape(-1))
    assert torch.equal(patches_to_image(p.reshape(8, 48), 8, 4, 3), x)


def test_decoder_loss_matches_hand_computation():
    _, model = tiny_model()
    b = batch([4, 0, 4])
    out = model(**forward_args(b))
    hidden = model(b["input_ids"]).hidden
    rows = hidden[b["input_ids"] == GEN]
    sub = model.modality_submodules["images"]
    pred = sub.decoders["patch"](sub.output_projections[0](rows))
    target = torch.cat([b["modality_targets"]["images"][0], b["modality_targets"]["images"][2]])
    assert pred.shape == (8, 48)
    hand = sum(((pred[i] - target[i]) ** 2).mean() for i in range(8))
    torch.testing.assert_close(out.modality_loss_sums["images"], hand)
    assert out.modality_num_tokens["images"].item() == 8
    # The text loss is untouched by the Out path.
    plain = model(**forward_args({k: v for k, v in b.items() if k != "modality_targets"}))
    assert torch.equal(plain.loss_sum, out.loss_sum) and plain.modality_loss_sums == {}


def test_decoder_loss_gradient_matches_finite_differences():
    _, model = tiny_model(dtype=torch.float64)
    sub = model.modality_submodules["images"]
    rows = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    target = torch.randn(4, 48, dtype=torch.float64)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return sub.output_loss(sub.decode(x), target)[0]

    (grad,) = torch.autograd.grad(loss(rows), rows)
    eps = 1e-6
    for i, j in [(0, 0), (1, 5), (3, 15), (2, 7), (0, 11), (3, 2)]:
        bump = torch.zeros_like(rows)
        bump[i, j] = eps
        numeric = (loss(rows + bump) - loss(rows - bump)) / (2 * eps)
        torch.testing.assert_close(grad[i, j], numeric.detach(), rtol=1e-6, atol=1e-9)


def _grads_after(model, cfg, micro: list[dict]) -> dict[str, torch.Tensor]:
    """One trainer-style step's gradients: text over the global text count, Out path over its global count."""
    model.zero_grad()
    out_loss = OutPathLoss(cfg)
    n_text = sum((mb["labels"] != -100).sum() for mb in micro).float()
    out_loss.begin(micro, lambda t: t, torch.device("cpu"))
    for mb in micro:
        out = model(**forward_args(mb))
        (out.loss_sum / n_text + out_loss.term(out)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_normalisation_is_layout_independent():
    cfg, model = tiny_model(weight=2.5)
    b = batch([4, 0, 4, 4, 0, 0, 4, 4])
    whole = _grads_after(model, cfg, [b])
    for k in (4, 8):  # microbatch 2 of k=4 and several of k=8 hold no generation token at all
        split = _grads_after(model, cfg, split_microbatches(b, k))
        assert whole.keys() == split.keys()
        for name in whole:
            torch.testing.assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7)
    assert whole["modality_submodules.images.decoders.patch.head.weight"].abs().sum() > 0


def test_microbatch_without_generation_tokens_gives_zero_decoder_gradient():
    _, model = tiny_model()
    out = model(**forward_args(batch([0, 0])))
    assert out.modality_num_tokens["images"].item() == 0 and out.modality_loss_sums["images"].item() == 0
    out.modality_loss_sums["images"].backward()
    grads = [p.grad for p in model.modality_submodules["images"].decoders.parameters()]
    assert all(g is not None and not g.any() for g in grads)


def test_output_loss_weight_scales_the_out_term():
    cfg1, m1 = tiny_model(weight=1.0)
    cfg3, m3 = tiny_model(weight=3.0)
    b = batch([4, 4])
    g1 = _grads_after(m1, cfg1, [b])["modality_submodules.images.decoders.patch.head.weight"]
    g3 = _grads_after(m3, cfg3, [b])["modality_submodules.images.decoders.patch.head.weight"]
    torch.testing.assert_close(g3, 3 * g1)


def test_errors_name_the_fix():
    _, model = tiny_model()
    b = batch([4, 4])
    ids = b["input_ids"].clone()
    ids[0, 3] = 1  # sample 0 now has 3 generation tokens: not a whole image
    with pytest.raises(ValueError, match="exactly 4 generation tokens"):
        model(**forward_args({**b, "input_ids": ids}))
    with pytest.raises(ValueError, match="needs 4 rows but only 2"):
        model(**forward_args({**b, "modality_targets": {"images": b["modality_targets"]["images"][:, :2]}}))
    with pytest.raises(ValueError, match="has no Out path"):
        model.output_rows("audio", model(b["input_ids"]).hidden, b["input_ids"])


def test_config_checks():
    base = "configs/demo_text_to_image.toml"
    with pytest.raises(ConfigError, match="output_token_id .259. is already used by 'images'"):
        load_config(base, ["--model.modalities.images.output_token_id=259"])
    with pytest.raises(ConfigError, match=r"output_token_id \(400\) must lie in"):
        load_config(base, ["--model.modalities.images.output_token_id=400"])
    with pytest.raises(ConfigError, match="decoder.image .30. must be divisible by decoder.patch"):
        load_config(base, ["--model.modalities.images.decoder.image=30"])


def test_text_to_image_data_layout():
    data = TextToImageData(8, 4, seed=3, decoder=DecoderConfig(), output_token_id=261)
    b = data.collate(data.train[:2])
    ids, labels = b["input_ids"], b["labels"]
    assert b["modality_targets"]["images"].shape == (2, 16, 192)
    for i, smp in enumerate(data.train[:2]):
        prompt = data.tok.encode(smp.prompt)
        first = 1 + len(prompt)
        assert ids[i, first : first + 16].eq(261).all() and ids[i, first + 16] == data.tok.EOS
        assert labels[i, first - 1] == 261 and labels[i, first + 15] == data.tok.EOS
        assert (labels[i] != -100).sum() == 2
    assert ids.shape[1] % 8 == 0


def test_judge_and_generate_cli(tmp_path, capsys):
    cfg = load_config("configs/demo_text_to_image.toml", [
        "--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
        "--model.llm.mlp=64", "--model.modalities.images.decoder.hidden=32",
        "--model.modalities.images.decoder.layers=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(cfg))
    save_weights(model, run)
    out = tmp_path / "red.png"
    with pytest.raises(SystemExit) as done:
        cli_main(["generate", "--run", str(run), "--prompt", "draw a red square", "--out", str(out)])
    assert done.value.code == 0 and out.is_file()
    assert Image.open(out).size == (128, 128)
    judge = train_judge(32, samples=64, epochs=1)
    data = TextToImageData(4, 4, seed=5, decoder=copy.deepcopy(cfg.model.modalities["images"].decoder),
                           output_token_id=261)
    hits = judge_recognises(judge, np.stack([d.image for d in data.eval]), data.eval)
    assert set(hits) == {"color", "shape", "place"} and all(v.shape == (4,) for v in hits.values())
    capsys.readouterr()


def test_fsdp_with_the_out_path_is_refused_where_fsdp_cannot_reduce_unused_parameters(monkeypatch):
    """On a torch whose FSDP2 skips the reduce-scatter of unused parameters, a rank with no image to generate
    would leave the decoder's collective unmatched; the plan refuses before building anything."""
    cfg = load_config(ROOT / "configs" / "demo_text_to_image.toml", ["--parallel.modules.images.fsdp=true"])
    layout = Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2)
    monkeypatch.setattr(layout_rules, "FSDP_REDUCES_UNUSED_PARAMS", True)
    validate_plan(cfg, layout)
    monkeypatch.setattr(layout_rules, "FSDP_REDUCES_UNUSED_PARAMS", False)
    with pytest.raises(ConfigError, match=r"parallel.modules.images.fsdp = true with the Out path of \['images'\]"):
        validate_plan(cfg, layout)
    # the decoders live in the Out modality's submodule: FSDP of the LM alone uses every parameter each step
    lm_only = load_config(ROOT / "configs" / "demo_text_to_image.toml", ["--parallel.modules.language.fsdp=true"])
    validate_plan(lm_only, Layout.from_config(lm_only.parallel.modules, lm_only.model.module_names, 2))
