"""In-place weight updates of the served model.

Contract: ``check_state_dict`` accepts any subset of the model's
``state_dict()`` names with matching shapes and floating dtypes (a partial
update is allowed, an empty one is not) and raises a 400 ``EngineError``
naming what is wrong, before anything is copied. ``copy_state_dict`` then
copies the tensors into the model's own storage (casting dtype and device),
so tied weights and references held elsewhere stay valid. The caller runs the
copy where no forward pass is in flight (the engine does it on its compute
thread).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from harness_grpo.engine.errors import bad_request


def state_dict_from_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    """Parse a safetensors-serialised state dict (400 when it isn't one)."""
    try:
        return load_safetensors(data)
    except (SafetensorError, ValueError) as exc:
        raise bad_request(f"body is not a safetensors state dict: {exc}") from None


def check_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise a 400 ``EngineError`` unless every tensor matches a model tensor's name and shape."""
    if not state_dict:
        raise bad_request("the state dict is empty")
    targets = model.state_dict()
    unknown = sorted(name for name in state_dict if name not in targets)
    if unknown:
        raise bad_request(f"unknown tensor names (expected the model's state_dict names): {unknown[:5]}")
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise bad_request(f"{name}: expected a floating-point tensor")
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise bad_request(f"{name}: shape {tuple(tensor.shape)} != model shape {tuple(targets[name].shape)}")


@torch.no_grad()
def copy_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy checked tensors into the model's parameters and buffers."""
    targets = model.state_dict()
    for name, tensor in state_dict.items():
        targets[name].copy_(tensor)
