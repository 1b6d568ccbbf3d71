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
stays where it was. ``weight_sync_for`` picks the transport for an engine URL
(or none) by asking the engine what it is.

Adding a transport: a module here with a class that satisfies ``WeightSync``
(usually a ``common._Sync`` subclass), re-exported below and, if it serves a
new kind of engine, a branch in ``weight_sync_for``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from harness_grpo.distributed import broadcast_from_main, rank_world
from harness_grpo.weight_transports.common import (
    WeightMetadata,
    WeightSyncError,
    _ControlClient,
    params_for_sync,
    sync_name,
)
from harness_grpo.weight_transports.embedded import EmbeddedWeightSync, HTTPEmbeddedWeightSync
from harness_grpo.weight_transports.vllm_nccl import NCCLTransport, Transport, VLLMNCCLWeightSync

if TYPE_CHECKING:
    from harness_grpo.engine import EmbeddedEngine

logger = logging.getLogger(__name__)

__all__ = [
    "EMBEDDED_ENGINE_OWNER",
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
    "weight_sync_for",
]

# What the embedded engine's ``GET /v1/models`` answers as each model's ``owned_by``
# (``harness_grpo/engine/server.py``); vLLM answers "vllm".
EMBEDDED_ENGINE_OWNER = "harness-grpo"


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


# ----- picking the transport for an engine ----------------------------------------------------------

_EMBEDDED_HTTP, _VLLM = "embedded-http", "vllm"


def weight_sync_for(
    base_url: str | None,
    *,
    engine: EmbeddedEngine | None = None,
    timeout_s: float,
    initial_version: int,
    is_main: bool,
) -> WeightSync:
    """The weight transport for the engine at ``base_url``, or for the in-process ``engine`` without one.

    No ``base_url``: ``EmbeddedWeightSync(engine)``; the main rank must pass
    its engine, the other ranks pass None (they only gather in lock-step).
    With a ``base_url``, the main rank asks ``GET /v1/models`` (bounded by
    ``timeout_s``): models ``owned_by`` ``EMBEDDED_ENGINE_OWNER`` mean the
    embedded engine's HTTP server (``HTTPEmbeddedWeightSync``), anything else
    vLLM (``VLLMNCCLWeightSync``); an engine that does not answer, or answers
    something that is not a model list, is a ``WeightSyncError`` naming the
    URL. The other ranks never call the engine: when ``torch.distributed`` is
    initialized, rank 0 broadcasts the kind (or its error) to them, so with a
    ``base_url`` this is a COLLECTIVE that every rank calls, and every rank
    gets the same class or the same error. ``timeout_s`` also bounds each
    control call of the transport; ``initial_version`` is its starting
    ``version``.
    """
    rank, world = rank_world()
    if world > 1 and is_main != (rank == 0):
        raise ValueError(f"is_main={is_main} on rank {rank}: the main rank must be rank 0 of the process group")
    if base_url is None:
        if is_main and engine is None:
            raise ValueError("weight_sync_for: the main rank needs its engine when no base_url is given")
        return EmbeddedWeightSync(engine, timeout_s=timeout_s, initial_version=initial_version)
    if not is_main and world == 1:
        raise ValueError(
            "weight_sync_for: a non-main rank learns the engine's kind from the main rank, "
            "which needs torch.distributed to be initialized"
        )
    kind, error, status = None, None, None
    if is_main:
        try:
            kind = _engine_kind(base_url, timeout_s)
        except WeightSyncError as exc:
            error, status = str(exc), exc.status
    if world > 1:
        kind, error, status = broadcast_from_main((kind, error, status))
    if error is not None:
        raise WeightSyncError(error if is_main else f"{error} (from rank 0)", status)
    logger.info("engine at %s is %s", base_url, kind)
    if kind == _EMBEDDED_HTTP:
        return HTTPEmbeddedWeightSync(base_url, timeout_s=timeout_s, initial_version=initial_version)
    return VLLMNCCLWeightSync(base_url, timeout_s=timeout_s, initial_version=initial_version)


def _engine_kind(base_url: str, timeout_s: float) -> str:
    """``_EMBEDDED_HTTP`` or ``_VLLM``, from the ``owned_by`` of the models ``base_url`` serves."""
    client = _ControlClient(base_url)
    try:
        answer = client.call("GET", "/v1/models", timeout_s=timeout_s)
    except WeightSyncError as exc:
        raise WeightSyncError(f"cannot tell which engine serves {base_url}: {exc}", exc.status) from exc
    finally:
        client.close()
    cards = answer.get("data")
    if not isinstance(cards, list) or not cards or not all(isinstance(card, dict) for card in cards):
        raise WeightSyncError(f"cannot tell which engine serves {base_url}: GET /v1/models answered {answer}")
    owners = {card.get("owned_by") for card in cards}
    return _EMBEDDED_HTTP if owners == {EMBEDDED_ENGINE_OWNER} else _VLLM
