"""mimo: train multimodal in/out models with a parallel layout per module.

The public API (Config, load_config, MimoModel, ModalitySubmodules, build_model) is imported on first use
(PEP 562), so `import mimo.cli` - every `mimo` command's start-up - does not pay for torch before argparse
has read the command line."""

import importlib

__all__ = ["Config", "MimoModel", "ModalitySubmodules", "build_model", "load_config"]
__version__ = "0.1.0"


_PUBLIC = {"Config": "mimo.config.schema", "load_config": "mimo.config.load", "build_model": "mimo.hf.build",
           "MimoModel": "mimo.models.multimodal", "ModalitySubmodules": "mimo.models.multimodal"}
"""Public name -> the module that defines it."""


def __getattr__(name: str):
    """`mimo.<name>` for the public API, imported on first access; AttributeError for anything else."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mimo' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
