"""mimo: train multimodal in/out models with a parallel layout per module.

The public API is imported on first use (PEP 562), so `import mimo.cli` - every `mimo` command's start-up - does
not pay for torch before argparse has read the command line:
- configs and models: Config, load_config, build_model, MimoModel, ModalitySubmodules;
- training: Trainer (`Trainer(cfg).train()`, or `with Trainer(cfg) as trainer:` to drive its steps; either way
  it leaves the process group it joined);
- Hugging Face in: import_llm, import_vision, import_audio_encoder, import_llava, import_llava_next,
  import_llava_onevision, import_qwen2_vl (needs only safetensors);
- Hugging Face out: export_run (`mimo export`), export_llava, export_llava_next, export_qwen2_vl,
  export_causal_lm, export_vision_tower (need the `hf` extra)."""

import importlib

_HF_IN = ("import_audio_encoder", "import_llava", "import_llava_next", "import_llava_onevision", "import_llm",
          "import_qwen2_vl", "import_vision")
_HF_OUT = ("export_causal_lm", "export_llava", "export_llava_next", "export_qwen2_vl", "export_run",
           "export_vision_tower")

_PUBLIC = {"Config": "mimo.config.schema", "load_config": "mimo.config.load", "build_model": "mimo.hf.build",
           "MimoModel": "mimo.models.multimodal", "ModalitySubmodules": "mimo.models.multimodal",
           "Trainer": "mimo.train.trainer", **dict.fromkeys(_HF_IN, "mimo.hf"), **dict.fromkeys(_HF_OUT, "mimo.export")}
"""Public name -> the module that defines (or re-exports) it."""

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    """`mimo.<name>` for the public API, imported on first access; AttributeError for anything else."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mimo' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
