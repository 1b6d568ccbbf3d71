"""Weight transports to the embedded engine (``harness_grpo.engine``): in-process and over HTTP.

Contract. Both gather a CPU state dict on every rank (``params_for_sync``,
before anything is paused; only rank 0 gets tensors), then rank 0 pushes it
and the ranks agree on the outcome. The state dict is detached, cloned to
contiguous CPU memory and named like the engine model's ``state_dict()``.

- ``EmbeddedWeightSync(engine)``: in-process to an ``EmbeddedEngine`` living
  in this process (on rank 0; None on the other ranks): the names are checked
  against the engine model before pausing, then ``pause("keep")`` →
  ``update_weights(state_dict, version=version + 1)`` → ``resume()`` (in
  ``finally``). Every engine call is bounded by ``timeout_s``.
- ``HTTPEmbeddedWeightSync(base_url)``: the same over the embedded engine's
  HTTP control routes (``harness_grpo/engine/server.py``, served by ``python
  -m harness_grpo.engine``): ``POST /pause?mode=keep`` → ``POST
  /update_weights?version=N`` with a safetensors body (bounded by
  ``transfer_timeout_s``) → ``POST /resume``. A control call is bounded by
  ``timeout_s``, the best-effort resume after a failure by
  ``cleanup_timeout_s``; the failure's ``WeightSyncError`` says whether that
  resume worked. Its first push says ``rebase=true``: the engine server may
  have served an earlier run, whose versions this run's numbering restarts.

``pause(mode="keep")`` freezes in-flight requests, which then finish under
the new weights: one rollout can mix two policy versions (REFERENCE §1.5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness_grpo.weight_transports.common import (
    WeightSyncError,
    _agree_or_raise,
    _as_sync_error,
    _ControlClient,
    _positive,
    _Sync,
    params_for_sync,
)

if TYPE_CHECKING:
    from harness_grpo.engine import EmbeddedEngine

__all__ = ["EmbeddedWeightSync", "HTTPEmbeddedWeightSync"]

_OCTET = {"Content-Type": "application/octet-stream"}


def _cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0: every parameter, detached and copied to contiguous CPU memory; other ranks: ``{}``."""
    return {name: t.to("cpu", copy=True).contiguous() for name, t in params_for_sync(model)}


class _StateDictSync(_Sync):
    """Gather a CPU state dict on every rank (before pausing anything), then rank 0 pushes it."""

    def _sync(self, model: torch.nn.Module, rank: int, new_version: int) -> None:
        state = _cpu_state_dict(model)  # every rank gathers; only rank 0 has tensors
        error = None
        if rank == 0:
            try:
                self._push(state, new_version)
            except Exception as exc:
                error = _as_sync_error(exc, "the weight update")
        _agree_or_raise(error, "the weight update")

    def _push(self, state: dict[str, torch.Tensor], new_version: int) -> None:
        raise NotImplementedError


class EmbeddedWeightSync(_StateDictSync):
    """In-process weight sync to an ``EmbeddedEngine`` living in this process (on rank 0)."""

    def __init__(self, engine: EmbeddedEngine | None, *, timeout_s: float = 300.0, initial_version: int = 0) -> None:
        """``engine``: the engine on rank 0; None on the other ranks, which only gather in lock-step."""
        super().__init__(timeout_s=timeout_s, cleanup_timeout_s=timeout_s, initial_version=initial_version)
        self.engine = engine

    def _push(self, state: dict[str, torch.Tensor], new_version: int) -> None:
        from harness_grpo.engine.errors import EngineError

        if self.engine is None:
            raise WeightSyncError("rank 0 has no engine to push to (EmbeddedWeightSync(None) is for other ranks)")
        targets = self.engine.model.state_dict()
        unknown = sorted(name for name in state if name not in targets)
        if unknown:
            raise WeightSyncError(f"trainer parameters the engine model does not have: {unknown[:5]}")
        try:
            self.engine.pause("keep", self.timeout_s)
            got = self.engine.update_weights(state, version=new_version, timeout_s=self.timeout_s)
        except EngineError as exc:
            raise WeightSyncError(f"embedded engine refused the update ({exc.status}): {exc.message}") from exc
        finally:
            self.engine.resume()
        if got != new_version:
            raise WeightSyncError(f"embedded engine reports version {got}, expected {new_version}")


class HTTPEmbeddedWeightSync(_StateDictSync):
    """Weight sync to the embedded engine's HTTP server (``python -m harness_grpo.engine``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        transfer_timeout_s: float = 600.0,
        cleanup_timeout_s: float = 10.0,
        initial_version: int = 0,
    ) -> None:
        super().__init__(timeout_s=timeout_s, cleanup_timeout_s=cleanup_timeout_s, initial_version=initial_version)
        _positive(transfer_timeout_s=transfer_timeout_s)
        self.transfer_timeout_s = transfer_timeout_s
        self._http = _ControlClient(base_url)
        self._pushed = False

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def _push(self, state: dict[str, torch.Tensor], new_version: int) -> None:
        from safetensors.torch import save

        body = save(state)
        try:
            paused = self._http.call("POST", "/pause", params={"mode": "keep"}, timeout_s=self.timeout_s)
            if paused.get("paused") is not True:
                raise WeightSyncError(f"POST /pause answered {paused}, expected paused: true")
            answer = self._http.call(
                "POST",
                "/update_weights",
                params={"version": str(new_version), "rebase": "false" if self._pushed else "true"},
                data=body,
                headers=_OCTET,
                timeout_s=self.transfer_timeout_s,
            )
            if answer.get("weight_version") != new_version:
                raise WeightSyncError(f"POST /update_weights answered {answer}, expected weight_version {new_version}")
            self._pushed = True
        except WeightSyncError as exc:
            raise WeightSyncError(f"{exc} ({self._resume_after_failure()})", exc.status) from exc
        resumed = self._http.call("POST", "/resume", timeout_s=self.timeout_s)
        if resumed.get("paused") is not False:
            raise WeightSyncError(f"POST /resume answered {resumed}, expected paused: false")

    def _resume_after_failure(self) -> str:
        try:
            self._http.call("POST", "/resume", timeout_s=self.cleanup_timeout_s)
        except WeightSyncError as exc:
            return f"cleanup: resume failed: {exc}"
        return "cleanup: resumed"

    def close(self) -> None:
        super().close()
        self._http.close()
