"""Hugging Face out: a trained run or MimoModel as a LLaVA (-NeXT, -OneVision), Qwen2-VL / Qwen2.5-VL or
causal-LM directory (needs the `hf` extra)."""

from mimo.export.hf import export_causal_lm, export_llava, export_vision_tower
from mimo.export.llava_next import export_llava_next
from mimo.export.qwen2_vl import export_qwen2_vl
from mimo.export.run import export_run

__all__ = ["export_causal_lm", "export_llava", "export_llava_next", "export_qwen2_vl", "export_run",
           "export_vision_tower"]
