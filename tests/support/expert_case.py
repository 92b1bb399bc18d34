"""The expert-parallel tests' tiny MoE VLM (three routers), its batch, and the router set-up every layout shares."""

import torch

from mimo.config.schema import Config, ModuleLayoutConfig
from mimo.data.batching import COUNTS
from mimo.models.moe import moe_layers
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm
from tests.support.parity import freeze_key_biases

N, S, IMG, TOKENS_PER_IMAGE = 8, 12, 60, 4
IMAGES = [0, 1, 2, 1, 0, 1, 1, 0]
ROUTERS = {
    "softmax": dict(moe_top_k=2, moe_aux_loss_weight=0.1, moe_z_loss_weight=0.01),
    "all_to_one": dict(moe_top_k=1, moe_gating="sigmoid"),
    "plain": dict(moe_top_k=2),
}


def moe_config(lm: dict, router: str, micro: int) -> Config:
    llm = tiny_llm(init_std=0.1, moe_experts=4, moe_mlp=16, **ROUTERS[router])
    return tiny_vlm(llm, tiny_vit(init_std=0.1), IMG,
                    {"language": ModuleLayoutConfig(**lm), "images": ModuleLayoutConfig()}, micro, N)


def moe_batch() -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 50, (N, S), generator=g)
    labels = torch.randint(1, 50, (N, S), generator=g)
    for i, k in enumerate(IMAGES):
        ids[i, 1:1 + k * TOKENS_PER_IMAGE] = IMG
        labels[i, :k * TOKENS_PER_IMAGE] = -100
    pixels = torch.randn(sum(IMAGES), 3, 8, 8, generator=g)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(S).expand(N, S).contiguous(),
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}}, COUNTS: {"images": torch.tensor(IMAGES)}}


def moe_prepare(model, router: str) -> None:
    """The same router-loss scale on every layout (what the trainer sets), and the imbalanced router's bias."""
    layers = moe_layers(model)
    for moe in layers.values():
        moe.set_loss_scale(1.0 / (len(layers) * N))
        if router == "all_to_one":
            moe.expert_bias[0] = 100.0
    freeze_key_biases(model)
