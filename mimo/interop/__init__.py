"""Hugging Face interop: import CLIP/SigLIP vision, Whisper encoder, Qwen2/Qwen3/Llama weights into mimo's
modules, export MimoModels as LLaVA or causal-LM directories, and LLaVA-style prompts.

Importing needs only `safetensors`; exporting and tokenizers need the `hf` extra (`pip install mimo[hf]`).
"""

from mimo.interop.hf_export import export_causal_lm, export_llava, export_run
from mimo.interop.hf_import import import_audio_encoder, import_llava, import_llm, import_vision
from mimo.interop.hf_weights import load_hf_weights

__all__ = ["export_causal_lm", "export_llava", "export_run", "import_audio_encoder", "import_llava", "import_llm",
           "import_vision", "load_hf_weights"]
