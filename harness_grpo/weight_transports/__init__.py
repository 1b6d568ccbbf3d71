"""Weight transports: push the trainer's weights to the engine that samples rollouts.

Contract (DESIGN.md, "Weight sync"). One protocol, ``WeightSync``, and one
module per transport:

- ``embedded``: ``EmbeddedWeightSync`` (in-process to an ``EmbeddedEngine``)
  and ``HTTPEmbeddedWeightSync`` (to the embedded engine served over HTTP by
  ``python -m harness_grpo.engine``);
- ``vllm_nccl``: ``VLLMNCCLWeightSync`` (vLLM's NCCL weight transfer), with
  its data plane behind ``Transport`` (``NCCLTransport``);
- ``common``: what they share (the parameter stream every rank iterates, the
  agreement across ranks, bounded HTTP calls and thread joins, the ``_Sync``
  frame that keeps the version).

Every wait has a timeout that fires and a ``WeightSyncError`` naming the
route or step; after a failure the engine was asked to resume and the version
stays where it was.

Adding a transport: a module here with a class that satisfies ``WeightSync``
(usually a ``common._Sync`` subclass), re-exported below.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from harness_grpo.weight_transports.common import (
    WeightMetadata,
    WeightSyncError,
    params_for_sync,
    sync_name,
)
from harness_grpo.weight_transports.embedded import EmbeddedWeightSync, HTTPEmbeddedWeightSync
from harness_grpo.weight_transports.vllm_nccl import NCCLTransport, Transport, VLLMNCCLWeightSync

__all__ = [
    "EmbeddedWeightSync",
    "HTTPEmbeddedWeightSync",
    "NCCLTransport",
    "Transport",
    "VLLMNCCLWeightSync",
    "WeightMetadata",
    "WeightSync",
    "WeightSyncError",
    "params_for_sync",
    "sync_name",
]


@runtime_checkable
class WeightSync(Protocol):
    """Pushes the trainer's weights to an engine.

    ``sync(model)`` copies ``model``'s parameters into the engine and returns
    the new policy version, which grows by exactly one per successful sync; it
    is called on EVERY rank of a multi-rank trainer (DDP, FSDP2), in the same
    order, because every rank takes part in gathering the parameters and in
    agreeing on the outcome (only rank 0 talks to the engine), so all ranks
    return the same version or all raise ``WeightSyncError``. It is not
    re-entrant (a second call while one runs raises), and a failed sync leaves
    ``version`` unchanged. ``version`` is the policy version the engine holds
    (``initial_version`` until the first sync). ``close()`` releases what the
    sync holds (threads, HTTP sessions, process groups); a closed sync raises
    on ``sync``. A ``WeightSyncError`` on a multi-rank run is fatal: the
    default process group may be mid-collective.
    """

    @property
    def version(self) -> int: ...

    def sync(self, model: torch.nn.Module) -> int: ...

    def close(self) -> None: ...
