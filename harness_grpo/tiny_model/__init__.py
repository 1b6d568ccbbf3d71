"""The tiny embedded-default model: built deterministically from shipped files."""

from harness_grpo.tiny_model.build import SERVED_MODEL_NAME, build_tiny_model, tiny_model_path
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

__all__ = ["SERVED_MODEL_NAME", "build_tiny_model", "tiny_model_path", "warm_tiny_model_path"]
