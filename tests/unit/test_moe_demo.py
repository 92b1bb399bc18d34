"""The MoE demo config in small: it trains, and `mimo export` of its run loads in transformers (LLaVA over
Mixtral, and the LM alone) with the logits of the trained mimo model."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.export import export_run
from mimo.train.checkpoint.weights import load_run
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.hf_helpers import TOL, compare, rel_diff, transformers

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--model.llm.hidden=32", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.moe_mlp=24",
         "--model.modalities.images.vit.hidden=32", "--model.modalities.images.vit.layers=1", "--train.steps=4",
         "--data.train_samples=64", "--data.eval_samples=2", "--data.global_batch=8", "--optim.warmup_steps=1",
         "--metrics.progress=false", "--metrics.tensorboard=false", "--train.threads=1"]


def test_the_moe_demo_exports_to_transformers_with_its_logits(tmp_path):
    cfg = load_config(CONFIGS / "demo_moe_vlm.toml", [*SMALL, f"--run.out_dir={tmp_path}"])
    Trainer(cfg).train()
    run = tmp_path / "demo_moe_vlm"
    _, model = load_run(run)
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(export_run(run, tmp_path / "llava")).eval()
    assert hf.config.text_config.model_type == "mixtral"
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    token = cfg.model.modalities["images"].token_id
    ids = torch.tensor([[1] + [token] * n + [5, 6, 7], [2] + [token] * n + [8, 9, 10]])
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model(ids, modality_inputs={"images": {"vit": {"pixel_values": pixels}}}).logits
        assert rel_diff(ours, hf(input_ids=ids, pixel_values=pixels).logits.float()) <= TOL
    lm = transformers.AutoModelForCausalLM.from_pretrained(export_run(run, tmp_path / "lm", lm_only=True)).eval()
    assert type(lm).__name__ == "MixtralForCausalLM"
    assert max(compare(model.language_model, lm.float())) <= TOL
