"""Hugging Face in: LMs (Qwen2/3, Llama, Mistral, Phi-3, OLMo 2, Gemma 2/3), vision towers (CLIP, SigLIP, SigLIP2,
DINOv2), Whisper's encoder, LLaVA, LLaVA-NeXT and LLaVA-OneVision into mimo's modules (needs only
`safetensors`). Export lives in mimo.export."""

from mimo.hf.llava_next import import_llava_next, import_llava_onevision
from mimo.hf.load import import_audio_encoder, import_llava, import_llm, import_vision, load_hf_weights

__all__ = ["import_audio_encoder", "import_llava", "import_llava_next", "import_llava_onevision", "import_llm",
           "import_vision", "load_hf_weights"]
