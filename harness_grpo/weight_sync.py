"""Weight sync: push the trainer's weights to the engine that samples rollouts.

Contract (DESIGN.md, "Weight sync"). One protocol, ``WeightSync``:
``sync(model) -> int`` copies ``model``'s parameters into the engine and
returns the new policy version, which grows by exactly one per successful
sync; ``version`` is the current one (``initial_version`` until the first
sync); ``close()`` releases what the sync holds. Every wait is bounded: a
control call by ``timeout_s``, a transfer by ``transfer_timeout_s``, an NCCL
init by ``init_timeout_s``, each best-effort cleanup call by
``cleanup_timeout_s``. Whatever fails, times out, or answers anything but 200
with a JSON object raises ``WeightSyncError`` naming the route or step, after
the engine was asked to resume (and, for vLLM, to finish a started update);
the version then stays where it was. ``sync`` is not re-entrant: a second call
while one runs is a ``WeightSyncError``.

Transports:

- ``EmbeddedWeightSync(engine)``: in-process to an ``EmbeddedEngine``:
  ``pause("keep")`` → ``update_weights(state_dict, version=version + 1)`` →
  ``resume()`` (in ``finally``). The state dict is detached, cloned to CPU and
  named like the engine model's ``state_dict()`` (checked before pausing).
- ``HTTPEmbeddedWeightSync(base_url)``: the same over the embedded engine's
  HTTP control routes (``harness_grpo/engine/server.py``): ``POST
  /pause?mode=keep``, ``POST /update_weights?version=N`` with a safetensors
  body, ``POST /resume``.
- ``VLLMNCCLWeightSync(base_url)``: vLLM's NCCL weight transfer (vLLM 0.22 to
  0.25, ``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config
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

  The NCCL calls run behind ``Transport`` (``NCCLTransport`` by default, which
  imports vLLM only inside its methods) on daemon threads joined with a
  timeout, because a collective whose peer is gone blocks forever
  (huggingface/trl#6797, #6913). A transfer that failed leaves the NCCL group
  in an unknown state (a daemon thread may still be blocked in it): the sync is
  then *broken*, every later ``sync`` raises at once, and the caller must build
  a new ``VLLMNCCLWeightSync`` (which re-runs the init) or abort.

Multi-rank trainers (DDP, FSDP2): call ``sync`` on EVERY rank. Rank 0 (of the
default process group) talks to the engine; every rank iterates
``params_for_sync``, whose ``DTensor.full_tensor()`` gathers are collectives
that must run in the same order everywhere (huggingface/trl#7103), and the
ranks agree on the outcome with an all-reduce, so they all return the same
version or all raise. After a transport failure the default process group may
be mid-collective too: treat a ``WeightSyncError`` on a multi-rank run as fatal.

``pause(mode="keep")`` freezes in-flight requests, which then finish under the
new weights: one rollout can mix two policy versions (REFERENCE §1.5).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import aiohttp
import torch

from harness_grpo.distributed import rank_world

if TYPE_CHECKING:
    from harness_grpo.engine import EmbeddedEngine

logger = logging.getLogger(__name__)

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

# Prefixes that wrappers put in front of a checkpoint name: DDP / FSDP1 (``module.``), torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Wrappers that insert a path segment anywhere: FSDP1 units, activation checkpointing.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_OCTET = {"Content-Type": "application/octet-stream"}


class WeightSyncError(RuntimeError):
    """A weight sync that failed, timed out, or was refused; the message names the step.

    ``status`` is the HTTP status when a server answered with an error, else None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@runtime_checkable
class WeightSync(Protocol):
    """Pushes trainer weights to an engine; see the module docstring."""

    @property
    def version(self) -> int: ...

    def sync(self, model: torch.nn.Module) -> int: ...

    def close(self) -> None: ...


# ----- names, ranks and the parameter stream ----------------------------------------------------


def sync_name(name: str) -> str:
    """The checkpoint name of a trainer parameter: wrapper prefixes and segments removed."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name.removeprefix(prefix), True
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def _is_dtensor(tensor: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def params_for_sync(
    model: torch.nn.Module, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, full detached tensor)`` of each parameter, in ``named_parameters()`` order.

    EVERY RANK MUST ITERATE THIS TO THE END, in lock-step: for a ``DTensor``
    (FSDP2) parameter it calls ``full_tensor()``, an all-gather over the
    parameter's mesh, one parameter at a time (one full parameter in memory at
    once). The gather is completed (its stream synchronised) before the tensor
    is yielded, so a consumer on other streams (vLLM's packed NCCL producer)
    never races it (huggingface/trl#6798). Only rank 0 yields; other ranks
    gather and discard, so ``for _ in params_for_sync(model): pass`` is their
    whole part. Tied parameters are yielded once (``named_parameters``
    de-duplicates). ``dtype``/``device`` convert what rank 0 yields. Buffers
    are not sent, and PEFT adapters must be merged first (their names exist
    only in the trainer).
    """
    rank, _ = rank_world()
    for name, param in model.named_parameters():
        tensor = param.detach()
        if _is_dtensor(tensor):
            tensor = tensor.full_tensor()
            if tensor.is_cuda:
                torch.cuda.current_stream(tensor.device).synchronize()
        if rank != 0:
            continue
        if dtype is not None or device is not None:
            tensor = tensor.to(device=device, dtype=dtype)
        yield sync_name(name), tensor


def _agree(ok: bool) -> bool:
    """True when every rank is ok (an all-reduce of a failure flag); ``ok`` itself in one process."""
    _, world = rank_world()
    if world == 1:
        return ok
    dist = torch.distributed
    backend = str(dist.get_backend())
    on_gpu = "nccl" in backend and "gloo" not in backend
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


@dataclass(frozen=True)
class WeightMetadata:
    """What vLLM needs to receive a streamed update: names, dtype names and global shapes, in send order."""

    names: tuple[str, ...]
    dtype_names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: torch.nn.Module, dtype: torch.dtype | None = None) -> WeightMetadata:
        """Read from ``named_parameters()`` without gathering (a ``DTensor``'s shape is the global one)."""
        names, dtype_names, shapes = [], [], []
        for name, param in model.named_parameters():
            names.append(sync_name(name))
            dtype_names.append(str(dtype or param.dtype).removeprefix("torch."))
            shapes.append(tuple(int(s) for s in param.shape))
        if not names:
            raise WeightSyncError("the model has no parameters to sync")
        return cls(tuple(names), tuple(dtype_names), tuple(shapes))

    def update_info(self) -> dict[str, Any]:
        """The body of ``update_info`` (vLLM ``NCCLWeightTransferUpdateInfo``; unknown keys are a 500 there)."""
        return {
            "names": list(self.names),
            "dtype_names": list(self.dtype_names),
            "shapes": [list(shape) for shape in self.shapes],
            "packed": True,
        }

    def checked(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``named_tensors``, raising ``WeightSyncError`` as soon as one differs from this metadata or is missing."""
        count = 0
        for index, (name, tensor) in enumerate(named_tensors):
            if index >= len(self.names):
                raise WeightSyncError(f"more tensors than the {len(self.names)} announced (extra: {name})")
            got = (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
            want = (self.names[index], self.dtype_names[index], self.shapes[index])
            if got != want:
                raise WeightSyncError(f"tensor {index} is {got}, announced as {want}")
            count += 1
            yield name, tensor
        if count != len(self.names):
            raise WeightSyncError(f"only {count} of the {len(self.names)} announced tensors were produced")


def _cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0: every parameter, detached and copied to contiguous CPU memory; other ranks: ``{}``."""
    return {name: t.to("cpu", copy=True).contiguous() for name, t in params_for_sync(model)}


def _run_in_daemon_thread(fn: Callable[..., Any], *args: Any, name: str) -> concurrent.futures.Future:
    """``fn(*args)`` on a fresh daemon thread; the future holds its result or exception."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _await_all(futures: Mapping[str, concurrent.futures.Future], timeout_s: float) -> dict[str, Any]:
    """Results by name; the first failure, or the ones still running after ``timeout_s``, raise."""
    by_future = {future: name for name, future in futures.items()}
    done, pending = concurrent.futures.wait(
        by_future, timeout=timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    for future in done:
        exc = future.exception()
        if exc is None:
            continue
        name = by_future[future]
        if isinstance(exc, WeightSyncError):
            message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
            raise WeightSyncError(message, exc.status) from exc
        raise WeightSyncError(f"{name} failed: {type(exc).__name__}: {exc}") from exc
    if pending:
        stalled = ", ".join(sorted(by_future[f] for f in pending))
        raise WeightSyncError(f"{stalled} did not finish within {timeout_s}s")
    return {name: future.result() for name, future in futures.items()}


# An HTTP call that runs beside a transport step gets this much longer than the joint wait, so that the
# wait, which names every step still running, is what reports a stall.
_HTTP_GRACE_S = 1.0


def _positive(**values: float) -> None:
    for key, value in values.items():
        if not value > 0:
            raise ValueError(f"{key} must be > 0, got {value}")


# ----- blocking HTTP with hard deadlines ------------------------------------------------------------


class _ControlClient:
    """Blocking JSON calls to one server, each bounded by a total timeout.

    The calls run on a private event loop thread (aiohttp), so a call can also be
    started and awaited later (``start``), as ``/update_weights`` is while NCCL
    streams. A reply counts only if it is a 200 with a JSON object body; anything
    else is a ``WeightSyncError`` naming the route.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="weight-sync-http", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def start(
        self,
        method: str,
        path: str,
        *,
        timeout_s: float,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> concurrent.futures.Future:
        """Send the request now; the future resolves to the reply's JSON object or raises ``WeightSyncError``."""
        coroutine = self._request(method, path, timeout_s, params, json_body, data, headers)
        return asyncio.run_coroutine_threadsafe(coroutine, self._event_loop())

    def call(self, method: str, path: str, *, timeout_s: float, **kwargs: Any) -> dict[str, Any]:
        """``start`` and wait for the reply (at most ``timeout_s``, plus a second for the loop to hand it over)."""
        future = self.start(method, path, timeout_s=timeout_s, **kwargs)
        try:
            return future.result(timeout=timeout_s + _HTTP_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise WeightSyncError(f"{method} {path}: no answer within {timeout_s}s") from None
        except concurrent.futures.CancelledError:
            raise WeightSyncError(f"{method} {path}: cancelled (the client was closed)") from None

    async def _request(
        self,
        method: str,
        path: str,
        timeout_s: float,
        params: Mapping[str, str] | None,
        json_body: Any,
        data: bytes | None,
        headers: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        route = f"{method} {path}"
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.request(
                method,
                self.base_url + path,
                params=params,
                json=json_body,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                status, body = resp.status, await resp.read()
        except TimeoutError:
            raise WeightSyncError(f"{route}: no answer within {timeout_s}s") from None
        except aiohttp.ClientError as exc:
            raise WeightSyncError(f"{route}: {type(exc).__name__}: {exc}") from exc
        snippet = body[:500].decode("utf-8", "replace")
        if status != 200:
            raise WeightSyncError(f"{route} answered HTTP {status}: {snippet}", status)
        try:
            parsed = json.loads(body)
        except ValueError:
            raise WeightSyncError(f"{route} answered 200 without a JSON body: {snippet!r}") from None
        if not isinstance(parsed, dict):
            raise WeightSyncError(f"{route} answered 200 with JSON that is not an object: {snippet}")
        return parsed

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close(self) -> None:
        """Cancel what is in flight, close the session and stop the loop thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5.0)
        except Exception as exc:  # closing is best effort; the thread is a daemon
            logger.warning("weight sync HTTP client did not shut down cleanly: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()


# ----- the shared frame: lock, version, ranks -------------------------------------------------------


class _Sync:
    """Version bookkeeping and the one-sync-at-a-time rule; subclasses implement ``_sync``."""

    def __init__(self, *, timeout_s: float, cleanup_timeout_s: float, initial_version: int) -> None:
        _positive(timeout_s=timeout_s, cleanup_timeout_s=cleanup_timeout_s)
        if initial_version < 0:
            raise ValueError(f"initial_version must be >= 0, got {initial_version}")
        self.timeout_s = timeout_s
        self.cleanup_timeout_s = cleanup_timeout_s
        self._version = initial_version
        self._busy = threading.Lock()
        self._closed = False
        self.last_sync_s: float | None = None

    @property
    def version(self) -> int:
        """The policy version the engine holds after the last successful sync."""
        return self._version

    def sync(self, model: torch.nn.Module) -> int:
        """Push ``model``'s weights; returns the new version (see the module docstring)."""
        if self._closed:
            raise WeightSyncError(f"{type(self).__name__} is closed")
        if not self._busy.acquire(blocking=False):
            raise WeightSyncError("another weight sync is in progress on this object")
        try:
            start = time.monotonic()
            rank, _ = rank_world()
            self._sync(model, rank, self._version + 1)
            self._version += 1
            self.last_sync_s = time.monotonic() - start
            logger.info("weights synced: version %d in %.3fs", self._version, self.last_sync_s)
            return self._version
        finally:
            self._busy.release()

    def _sync(self, model: torch.nn.Module, rank: int, new_version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> _Sync:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_sync_error(exc: Exception, what: str) -> WeightSyncError:
    """``exc`` as a ``WeightSyncError`` (unexpected errors are wrapped, the cause kept), so that every
    rank learns of it through the agreement instead of waiting forever in a collective."""
    if isinstance(exc, WeightSyncError):
        return exc
    error = WeightSyncError(f"{what} failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _agree_or_raise(error: WeightSyncError | None, what: str) -> None:
    """Raise on every rank when any rank failed (rank 0's own error where it has one)."""
    if not _agree(error is None):
        raise error or WeightSyncError(f"{what} failed on another rank (rank 0 has the details)")


# ----- in-process and HTTP to the embedded engine ----------------------------------------------------


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
                params={"version": str(new_version)},
                data=body,
                headers=_OCTET,
                timeout_s=self.transfer_timeout_s,
            )
            if answer.get("weight_version") != new_version:
                raise WeightSyncError(f"POST /update_weights answered {answer}, expected weight_version {new_version}")
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


# ----- vLLM over NCCL -----------------------------------------------------------------------------


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
