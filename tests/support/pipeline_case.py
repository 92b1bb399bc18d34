"""The pipeline tests' tiny VLM, its batches and its single-process reference, shared by the pipelined suites."""

import torch

from mimo.config.schema import Config, ModuleLayoutConfig
from tests.support.configs import image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.parity import grads_then_step

RTOL = 1e-5
IMG, S, MICRO, PER_MB = 60, 16, 4, 4
IMAGES_PER_SAMPLE = [0, 2, 1, 1, 2, 0, 1, 0, 0, 0, 0, 0, 1, 1, 2, 0]


def pipeline_module(offset: int, tp: int, pp: int, dp: int, sp: bool = False, cp: int = 1) -> ModuleLayoutConfig:
    return ModuleLayoutConfig(offset=offset, size=tp * pp * dp * cp, tp=tp, pp=pp, cp=cp, sequence_parallel=sp)


def pipeline_config(enc: tuple[int, int, int], lm: tuple[int, ...], tied: bool, sp: bool = False) -> Config:
    enc_size = enc[0] * enc[1] * enc[2]
    tp, pp, dp, *cp = lm
    lm_module = pipeline_module(enc_size, tp, pp, dp, sp, *cp)
    # PARITY_OPTIM's clip below the norm exercises the global norm across disjoint modules.
    return tiny_vlm(tiny_llm(layers=3, init_std=0.1, tie_embeddings=tied), tiny_vit(layers=2, init_std=0.1), IMG,
                    {"images": pipeline_module(0, *enc), "language": lm_module}, MICRO, PER_MB * MICRO)


def pipeline_batch() -> dict:
    return image_text_batch(torch.tensor(IMAGES_PER_SAMPLE), S, IMG, torch.Generator().manual_seed(7))


def pipeline_reference(cfg: Config, batch: dict, model) -> dict:
    out = model(batch["input_ids"], labels=batch["labels"], modality_inputs=batch["modality_inputs"])
    loss = out.loss_sum / out.num_tokens
    loss.backward()
    grads, params = grads_then_step(cfg, model)
    return {"loss": loss.item(), "grads": grads, "params": params}
