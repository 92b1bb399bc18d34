"""Hugging Face in: CLIP/SigLIP vision, Whisper encoder and Qwen2/Qwen3/Llama weights into mimo's modules
(needs only `safetensors`). Export lives in mimo.export."""

from mimo.hf.load import import_audio_encoder, import_llava, import_llm, import_vision, load_hf_weights

__all__ = ["import_audio_encoder", "import_llava", "import_llm", "import_vision", "load_hf_weights"]
