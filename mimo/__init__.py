"""mimo: train multimodal in/out models with a parallel layout per module."""

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.hf.build import build_model
from mimo.models.multimodal import MimoModel, ModalitySubmodules

__all__ = ["Config", "MimoModel", "ModalitySubmodules", "build_model", "load_config"]
__version__ = "0.1.0"
