"""The context-parallel tests' tiny VLM and its sizes."""

from mimo.config.schema import Config, ModuleLayoutConfig
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm

N, S, PACK, IMG, PAD, TOKENS_PER_IMAGE = 16, 16, 32, 60, 0, 4


def cp_config(lm: dict, enc_tp: int, micro: int, tie: bool = False) -> Config:
    return tiny_vlm(tiny_llm(init_std=0.1, tie_embeddings=tie), tiny_vit(init_std=0.1), IMG,
                    {"language": ModuleLayoutConfig(**lm), "images": ModuleLayoutConfig(tp=enc_tp)}, micro, N)
