"""Weight transport to vLLM over NCCL: the four-phase update with pause/resume (REFERENCE §1.5).

Contract. ``VLLMNCCLWeightSync(base_url)`` drives vLLM's NCCL weight transfer
(vLLM 0.22 to 0.25, ``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config
'{"backend":"nccl"}'``). Control plane (vllm ``vllm/entrypoints/serve/dev/
rlhf/api_router.py``; payloads as in ``examples/rl/rlhf_http_nccl.py`` and
TRL ``trl/experimental/async_grpo/vllm_client.py``):

* once: ``GET /get_world_size`` → ``{"world_size": W}``; then, concurrently,
  ``POST /init_weight_transfer_engine`` with ``{"init_info": {master_address,
  master_port, rank_offset: 1, world_size: W + 1}}`` and the trainer's
  ``NCCLWeightTransferEngine.trainer_init`` (rank 0 of the group), both
  blocking until the other side joins. The update metadata (names without
  wrapper prefixes, dtype names, global shapes) is collected here, once.
* each sync: ``POST /pause?mode=keep`` → ``POST /start_weight_update`` with
  ``{"is_checkpoint_format": true}`` → ``POST /update_weights`` with
  ``{"update_info": {names, dtype_names, shapes, packed: true}}``, in flight
  while the trainer streams ``trainer_send_weights(iterator,
  NCCLTrainerSendWeightsArgs(group, packed=True))`` (vllm
  ``vllm/distributed/weight_transfer/nccl_engine.py``) → ``POST
  /finish_weight_update`` with ``{}`` → ``POST /resume`` → version + 1.

Every wait is bounded: a control call by ``timeout_s``, a transfer by
``transfer_timeout_s``, the NCCL init by ``init_timeout_s``, each best-effort
cleanup call by ``cleanup_timeout_s``. Whatever fails, times out, or answers
anything but 200 with a JSON object raises ``WeightSyncError`` naming the
route or step, after the engine was asked to finish a started update and to
resume; the version then stays where it was.

The NCCL calls run behind ``Transport`` (``NCCLTransport`` by default, which
imports vLLM only inside its methods) on daemon threads joined with a
timeout, because a collective whose peer is gone blocks forever
(huggingface/trl#6797, #6913). A transfer that failed leaves the NCCL group
in an unknown state (a daemon thread may still be blocked in it): the sync is
then *broken*, every later ``sync`` raises at once, and the caller must build
a new ``VLLMNCCLWeightSync`` (which re-runs the init) or abort.

Ranks: only rank 0 (of the default process group) talks to vLLM and joins the
NCCL group; every rank calls ``init`` and ``sync`` and iterates
``params_for_sync`` in lock-step, and the ranks agree on each phase's outcome.

``pause(mode="keep")`` freezes in-flight requests, which then finish under
the new weights: one rollout can mix two policy versions (REFERENCE §1.5).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import torch

from harness_grpo.distributed import rank_world
from harness_grpo.weight_transports.common import (
    _HTTP_GRACE_S,
    WeightMetadata,
    WeightSyncError,
    _agree_or_raise,
    _as_sync_error,
    _await_all,
    _ControlClient,
    _positive,
    _run_in_daemon_thread,
    _Sync,
    params_for_sync,
)

logger = logging.getLogger(__name__)

__all__ = ["NCCLTransport", "Transport", "VLLMNCCLWeightSync"]


class Transport(Protocol):
    """The data plane of ``VLLMNCCLWeightSync``: rank 0 of the trainer–engine group.

    Both methods block and run on daemon threads that the sync joins with a
    timeout; a transport need not time out itself. ``init`` joins the group (it
    returns once every engine worker has joined); ``send`` streams every tensor
    of ``named_tensors`` (consuming the iterator drives the FSDP gathers) and
    returns once the data has left; ``close`` drops the group.
    """

    def init(self, master_address: str, master_port: int, world_size: int) -> None: ...

    def send(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None: ...

    def close(self) -> None: ...


def _import_nccl_engine() -> Any:
    try:
        from vllm.distributed.weight_transfer import nccl_engine
    except ImportError as exc:
        raise WeightSyncError(
            "NCCLTransport needs vLLM (the `vllm` extra: vllm>=0.22,<0.26) and a CUDA device"
        ) from exc
    return nccl_engine


class NCCLTransport:
    """vLLM's trainer-side NCCL weight transfer (``vllm/distributed/weight_transfer/nccl_engine.py``).

    ``init`` calls ``NCCLWeightTransferEngine.trainer_init({master_address,
    master_port, world_size})`` (the trainer is rank 0; the call hosts the
    ``StatelessProcessGroup`` store and builds a ``PyNcclCommunicator``);
    ``send`` calls ``trainer_send_weights(iterator,
    NCCLTrainerSendWeightsArgs(group=..., packed=True))`` and then synchronises
    the device, so a send whose receivers never arrive blocks here (and the
    caller's join times out) instead of in the next training step. The CUDA
    device is per thread, so both set ``device`` (default: the current device
    when the transport is built) on the thread they run on. vLLM is imported
    only inside these methods.
    """

    def __init__(self, device: torch.device | int | None = None) -> None:
        if device is None and torch.cuda.is_available():
            device = torch.cuda.current_device()
        self.device = torch.device("cuda", device) if isinstance(device, int) else device
        self.group: Any = None

    def _use_device(self) -> None:
        if self.device is None or not torch.cuda.is_available():
            raise WeightSyncError("NCCLTransport needs a CUDA device")
        torch.cuda.set_device(self.device)

    def init(self, master_address: str, master_port: int, world_size: int) -> None:
        nccl_engine = _import_nccl_engine()
        self._use_device()
        self.group = nccl_engine.NCCLWeightTransferEngine.trainer_init(
            {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        )

    def send(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.group is None:
            raise WeightSyncError("NCCLTransport.send before init")
        nccl_engine = _import_nccl_engine()
        self._use_device()
        args = nccl_engine.NCCLTrainerSendWeightsArgs(group=self.group, packed=True)
        nccl_engine.NCCLWeightTransferEngine.trainer_send_weights(iterator=named_tensors, trainer_args=args)
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        group, self.group = self.group, None
        # As TRL's WeightTransferClient.destroy: drop the store and socket so the master port is released.
        inner = getattr(group, "group", None)
        if inner is not None:
            for attr in ("store", "socket"):
                if hasattr(inner, attr):
                    setattr(inner, attr, None)


def _address_towards(host: str) -> str:
    """The local address the engine at ``host`` reaches this process on (loopback for a loopback host)."""
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))  # UDP connect picks the route; nothing is sent
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


class VLLMNCCLWeightSync(_Sync):
    """vLLM's four-phase NCCL weight update with pause/resume; see the module docstring.

    ``transport`` defaults to ``NCCLTransport()``; tests pass a stand-in.
    ``master_address`` defaults to the local address that routes to the
    server's host, ``master_port`` to a free port (picked at init).
    ``send_dtype`` casts what is streamed (e.g. fp32 master weights sent as
    bf16); the server loads whatever dtype the metadata announces.
    """

    def __init__(
        self,
        base_url: str,
        *,
        transport: Transport | None = None,
        timeout_s: float = 60.0,
        init_timeout_s: float = 300.0,
        transfer_timeout_s: float = 600.0,
        cleanup_timeout_s: float = 10.0,
        master_address: str | None = None,
        master_port: int | None = None,
        send_dtype: torch.dtype | None = None,
        initial_version: int = 0,
    ) -> None:
        super().__init__(timeout_s=timeout_s, cleanup_timeout_s=cleanup_timeout_s, initial_version=initial_version)
        _positive(init_timeout_s=init_timeout_s, transfer_timeout_s=transfer_timeout_s)
        self.init_timeout_s = init_timeout_s
        self.transfer_timeout_s = transfer_timeout_s
        self.master_address = master_address
        self.master_port = master_port
        self.send_dtype = send_dtype
        self.transport: Transport = transport if transport is not None else NCCLTransport()
        self.metadata: WeightMetadata | None = None
        self.engine_world_size: int | None = None
        self.broken: str | None = None
        self._initialized = False
        self._http = _ControlClient(base_url)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    # -- init (once) --

    def init(self, model: torch.nn.Module) -> None:
        """Join the NCCL group with the engine's workers and collect the metadata; every rank calls it.

        ``sync`` calls it on first use. A failed init can be retried (a new port is picked).
        """
        if self._initialized:
            return
        rank, _ = rank_world()
        error = None
        if rank == 0:
            try:
                self._init_rank0(model)
            except Exception as exc:
                error = _as_sync_error(exc, "the weight transfer init")
        _agree_or_raise(error, "the weight transfer init")
        self._initialized = True

    def _init_rank0(self, model: torch.nn.Module) -> None:
        metadata = WeightMetadata.of(model, self.send_dtype)
        answer = self._http.call("GET", "/get_world_size", timeout_s=self.timeout_s)
        world = answer.get("world_size")
        if not isinstance(world, int) or isinstance(world, bool) or world < 1:
            raise WeightSyncError(f"GET /get_world_size answered {answer}, expected a positive world_size")
        address = self.master_address or _address_towards(urlsplit(self.base_url).hostname or "127.0.0.1")
        port = self.master_port or _free_port(address)
        init_info = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world + 1}
        logger.info("joining vLLM's weight transfer group: %s", init_info)
        futures = {
            "POST /init_weight_transfer_engine": self._http.start(
                "POST",
                "/init_weight_transfer_engine",
                json_body={"init_info": init_info},
                timeout_s=self.init_timeout_s + _HTTP_GRACE_S,
            ),
            "transport init": _run_in_daemon_thread(
                self.transport.init, address, port, world + 1, name="weight-sync-transport-init"
            ),
        }
        try:
            _await_all(futures, self.init_timeout_s)
        except WeightSyncError:
            futures["POST /init_weight_transfer_engine"].cancel()
            self._close_transport()
            raise
        self.metadata, self.engine_world_size = metadata, world

    # -- each sync --

    def _sync(self, model: torch.nn.Module, rank: int, new_version: int) -> None:
        self.init(model)
        # Phase 1 (rank 0): check, pause, start. The agreement doubles as the barrier after the pause.
        error, state = None, _UpdateState()
        if rank == 0:
            try:
                self._prepare(model, state)
            except Exception as exc:
                error = self._cleanup(_as_sync_error(exc, "pausing the engine"), state)
        _agree_or_raise(error, "pausing the engine")
        # Phase 2: rank 0 streams (its iterator gathers); the others gather in lock-step and discard.
        error = None
        if rank == 0:
            try:
                self._transfer(model, state)
                state.finish_sent = True
                self._call("POST", "/finish_weight_update", json_body={})
                self._call("POST", "/resume")
                state.resumed = True
            except Exception as exc:
                error = self._cleanup(_as_sync_error(exc, "the weight transfer"), state)
        else:
            for _ in params_for_sync(model, dtype=self.send_dtype):
                pass
        _agree_or_raise(error, "the weight transfer")

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._http.call(method, path, timeout_s=self.timeout_s, **kwargs)

    def _prepare(self, model: torch.nn.Module, state: _UpdateState) -> None:
        if self.broken:
            raise WeightSyncError(f"this weight sync is broken ({self.broken}); build a new one")
        if WeightMetadata.of(model, self.send_dtype) != self.metadata:
            raise WeightSyncError("the model's parameter names, dtypes or shapes changed since the init")
        state.pause_sent = True
        self._call("POST", "/pause", params={"mode": "keep"})
        state.start = "sent"
        try:
            self._call("POST", "/start_weight_update", json_body={"is_checkpoint_format": True})
        except WeightSyncError as exc:
            # An error status means the server refused (nothing started); no answer means we can't know.
            state.start = "refused" if exc.status is not None else "unknown"
            raise
        state.start = "ok"

    def _transfer(self, model: torch.nn.Module, state: _UpdateState) -> None:
        assert self.metadata is not None
        stream = self.metadata.checked(params_for_sync(model, dtype=self.send_dtype))
        futures = {
            "POST /update_weights": self._http.start(
                "POST",
                "/update_weights",
                json_body={"update_info": self.metadata.update_info()},
                timeout_s=self.transfer_timeout_s + _HTTP_GRACE_S,
            ),
            "transport send": _run_in_daemon_thread(self.transport.send, stream, name="weight-sync-transport-send"),
        }
        try:
            _await_all(futures, self.transfer_timeout_s)
        except WeightSyncError as exc:
            futures["POST /update_weights"].cancel()
            self.broken = f"a transfer failed: {exc}"
            raise

    def _cleanup(self, exc: WeightSyncError, state: _UpdateState) -> WeightSyncError:
        """Best effort: finish a started update and resume a paused engine; the error, with what was done."""
        notes = []
        if state.start in ("ok", "unknown") and not state.finish_sent:
            try:
                self._http.call("POST", "/finish_weight_update", json_body={}, timeout_s=self.cleanup_timeout_s)
                notes.append("finish ok")
            except WeightSyncError as cleanup_exc:
                notes.append(f"finish failed: {cleanup_exc}")
        if state.pause_sent and not state.resumed:
            try:
                self._http.call("POST", "/resume", timeout_s=self.cleanup_timeout_s)
                notes.append("resume ok")
            except WeightSyncError as cleanup_exc:
                notes.append(f"resume failed: {cleanup_exc}")
        message = f"{exc} (cleanup: {'; '.join(notes)})" if notes else str(exc)
        logger.error("vLLM weight sync failed: %s", message)
        error = WeightSyncError(message, exc.status)
        error.__cause__ = exc
        return error

    def _close_transport(self) -> None:
        try:
            self.transport.close()
        except Exception as exc:  # best effort
            logger.warning("closing the weight transfer transport failed: %s", exc)

    def close(self) -> None:
        """Drop the NCCL group and stop the HTTP client (the vLLM server keeps its side until it restarts)."""
        super().close()
        self._close_transport()
        self._http.close()


@dataclass
class _UpdateState:
    """What one vLLM sync has done so far, for the cleanup."""

    pause_sent: bool = False
    start: str = "no"  # no | sent | ok | refused | unknown
    finish_sent: bool = False
    resumed: bool = False
