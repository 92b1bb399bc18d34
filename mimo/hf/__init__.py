"""Hugging Face in: LMs (Qwen2/3, Llama, Mistral, Phi-3, OLMo 2, Gemma 2/3), vision towers (CLIP, SigLIP, SigLIP2,
DINOv2), Whisper's encoder, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL and Qwen2.5-VL into mimo's modules (needs only
`safetensors`). Export lives in mimo.export."""

from mimo.hf.llava_next import import_llava_next, import_llava_onevision
from mimo.hf.load import import_audio_encoder, import_llava, import_llm, import_vision, load_hf_weights
from mimo.hf.qwen2_vl import import_qwen2_vl, qwen_vl_inputs

__all__ = ["import_audio_encoder", "import_llava", "import_llava_next", "import_llava_onevision", "import_llm",
           "import_qwen2_vl", "import_vision", "load_hf_weights", "qwen_vl_inputs"]
