"""The interleaved-pipeline tests' tiny VLM: an encoder rank feeding an LM cut into pp x virtual_stages chunks."""

from mimo.config.schema import Config, ModuleLayoutConfig
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm

IMG, S, PER_MB, STEPS = 60, 16, 2, 3


def interleaved_config(pp: int, micro: int, tied: bool, chunks: int = 2) -> Config:
    lm = ModuleLayoutConfig(offset=1, size=pp, pp=pp, virtual_stages=chunks)
    modules = {"images": ModuleLayoutConfig(offset=0, size=1), "language": lm}
    return tiny_vlm(tiny_llm(layers=pp * chunks, init_std=0.1, tie_embeddings=tied), tiny_vit(layers=2, init_std=0.1),
                    IMG, modules, micro, PER_MB * micro)
