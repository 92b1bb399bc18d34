"""Hugging Face out: a trained run or MimoModel as a LLaVA or causal-LM directory (needs the `hf` extra)."""

from mimo.export.hf import export_causal_lm, export_llava, export_run, export_vision_tower

__all__ = ["export_causal_lm", "export_llava", "export_run", "export_vision_tower"]
