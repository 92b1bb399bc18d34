"""mimo: train multimodal in/out models with a parallel layout per module.

The public API (Config, load_config, MimoModel, ModalitySubmodules, build_model) is imported on first use
(PEP 562), so `import mimo.cli` - every `mimo` command's start-up - does not pay for torch before argparse
has read the command line."""

__all__ = ["Config", "MimoModel", "ModalitySubmodules", "build_model", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`mimo.<name>` for the public API, imported on first access; AttributeError for anything else."""
    if name in ("Config", "load_config"):
        from mimo.config import load, schema

        return {"Config": schema.Config, "load_config": load.load_config}[name]
    if name == "build_model":
        from mimo.hf.build import build_model

        return build_model
    if name in ("MimoModel", "ModalitySubmodules"):
        from mimo.models import multimodal

        return getattr(multimodal, name)
    raise AttributeError(f"module 'mimo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
