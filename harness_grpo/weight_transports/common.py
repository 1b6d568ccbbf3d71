"""What every weight transport shares: names, the parameter stream, rank agreement, bounded waits.

Contract. ``params_for_sync`` is the one way a transport reads the trainer's
weights: EVERY RANK iterates it to the end, in the same order, because a
``DTensor`` (FSDP2) parameter's ``full_tensor()`` is a collective
(huggingface/trl#7103); only rank 0 yields. Names are checkpoint names
(``sync_name``: wrapper prefixes and segments removed). After each phase the
ranks agree on the outcome (``_agree_or_raise``, an all-reduce of a failure
flag), so they all succeed or all raise ``WeightSyncError``; after a transport
failure the default process group may be mid-collective, so a
``WeightSyncError`` on a multi-rank run is fatal.

``_Sync`` is the frame of every transport: ``version`` (``initial_version``
until the first sync, then +1 per successful sync), ``sync(model)`` (not
re-entrant: a second call while one runs is a ``WeightSyncError``; after a
failure the version stays where it was), ``close()``. A subclass implements
``_sync(model, rank, new_version)``.

Every wait is bounded: ``_ControlClient`` calls by their ``timeout_s``, steps
on daemon threads (``_run_in_daemon_thread``) by ``_await_all``'s timeout,
because a collective whose peer is gone blocks forever (huggingface/trl#6797,
#6913). An HTTP reply counts only if it is a 200 with a JSON object body;
anything else is a ``WeightSyncError`` naming the route.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import torch

from harness_grpo.distributed import rank_world
from harness_grpo.service_loop import ServiceLoop

logger = logging.getLogger(__name__)

# Prefixes that wrappers put in front of a checkpoint name: DDP / FSDP1 (``module.``), torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Wrappers that insert a path segment anywhere: FSDP1 units, activation checkpointing.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


class WeightSyncError(RuntimeError):
    """A weight sync that failed, timed out, or was refused; the message names the step.

    ``status`` is the HTTP status when a server answered with an error, else None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
        self._loop: ServiceLoop | None = None
        self._session: aiohttp.ClientSession | None = None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = ServiceLoop("weight-sync-http")
            return self._loop.loop

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
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run(self._shutdown(), 5.0)
        except Exception as exc:  # closing is best effort; the thread is a daemon
            logger.warning("weight sync HTTP client did not shut down cleanly: %s", exc)
        loop.close(5.0)


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
