"""Sandboxes: where an agent runs, one per rollout.

Contract (DESIGN.md, "Seams as code"). A ``Sandbox`` is one agent run's private place:

- ``workdir`` is its working tree, the task's files: ``setup`` prepares it, the agent works in it, the
  verifier reads it afterwards. ``home`` holds the agent's own state (HOME, configs, caches, logs) outside
  the working tree. Both are paths as the sandbox's processes see them; on a local backend they are also
  host paths.
- ``run(argv, env=..., timeout_s=...)`` runs a program in ``workdir`` (or ``cwd``) with exactly ``env``
  (nothing inherited) and stdin closed, in its own process group, and blocks until it exits or
  ``timeout_s`` passes (None: no limit). Then the whole group is killed, so nothing the program started
  outlives the call, and the ``ProcessResult`` is returned (``timed_out`` when the timeout fired). The call
  ends when the program exits even if something it started still holds its output open. ``close()`` from
  another thread ends a running call at once (its process killed by a signal: a negative ``returncode``).
- ``write_file(path, data)``, ``read_file(path)`` and ``mkdir(path)`` move files in and out: a relative path
  is under ``workdir``; an absolute one must lie inside the sandbox (``ValueError`` otherwise); parent
  directories are created.
- ``close()`` kills whatever runs and removes the sandbox; idempotent and safe from any thread. ``run``,
  ``write_file`` and ``mkdir`` on a closed sandbox raise ``SandboxClosed``.

Backends: ``TempDirSandbox`` (a temporary directory on the host, no isolation). Adding one (an isolated
local backend, a Harbor environment) means a class here or in its own module that satisfies ``Sandbox``;
the sessions (``harness_grpo.agent_sessions``) and the agent registry (``harness_grpo.agents``) only speak
this protocol.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


class SandboxClosed(RuntimeError):
    """The sandbox was closed: it runs nothing more and holds no files."""


@dataclass
class ProcessResult:
    """What one process run in a sandbox did."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool

    @property
    def label(self) -> str:
        return Path(self.argv[0]).name if self.argv else "process"

    def tail(self, chars: int = 4000) -> str:
        """The end of stdout and stderr, for error and assertion messages."""
        return (
            f"--- {self.label} rc={self.returncode} timed_out={self.timed_out} {self.elapsed_s:.1f}s\n"
            f"--- stdout\n{self.stdout[-chars:]}\n--- stderr\n{self.stderr[-chars:]}"
        )


@runtime_checkable
class Sandbox(Protocol):
    """Where one agent runs: working tree, process execution, files in and out, teardown (module docstring)."""

    @property
    def workdir(self) -> Path: ...

    @property
    def home(self) -> Path: ...

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float | None, cwd: Path | None = None
    ) -> ProcessResult: ...

    def write_file(self, path: str | Path, data: str | bytes) -> None: ...

    def read_file(self, path: str | Path) -> bytes: ...

    def mkdir(self, path: str | Path) -> None: ...

    def close(self) -> None: ...


class TempDirSandbox:
    """A temporary directory on the host: ``<root>/work`` is the working tree, ``<root>/home`` the agent's home.

    ``root`` comes from ``mkdtemp(prefix=prefix, dir=dir)``. No isolation: the processes see the host's
    filesystem and network; what keeps a run to itself is the environment the caller passes and the process
    group this sandbox kills.
    """

    def __init__(self, *, prefix: str = "agent-", dir: str | Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=dir)).resolve()
        self._workdir, self._home = self.root / "work", self.root / "home"
        self._workdir.mkdir()
        self._home.mkdir()
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._closed = False

    @property
    def workdir(self) -> Path:
        return self._workdir

    @property
    def home(self) -> Path:
        return self._home

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float | None, cwd: Path | None = None
    ) -> ProcessResult:
        argv = [str(part) for part in argv]
        workdir = self._inside(cwd if cwd is not None else self._workdir)
        started = time.monotonic()
        with (
            tempfile.TemporaryFile("w+", errors="replace") as out,
            tempfile.TemporaryFile("w+", errors="replace") as err,
        ):
            with self._lock:  # registered before close() can look, or refused after it
                self._check_open()
                process = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                self._running.add(process)
            timed_out = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)
                process.wait()
                with self._lock:
                    self._running.discard(process)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        return ProcessResult(argv, process.returncode, stdout, stderr, time.monotonic() - started, timed_out)

    def write_file(self, path: str | Path, data: str | bytes) -> None:
        target = self._inside(path)
        with self._lock:
            self._check_open()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.encode() if isinstance(data, str) else data)

    def read_file(self, path: str | Path) -> bytes:
        return self._inside(path).read_bytes()

    def mkdir(self, path: str | Path) -> None:
        target = self._inside(path)
        with self._lock:
            self._check_open()
            target.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Kill every process group still running here, then remove ``root``; idempotent, from any thread."""
        with self._lock:
            self._closed = True
            for process in self._running:
                _kill_group(process)
            shutil.rmtree(self.root, ignore_errors=True)

    def _inside(self, path: str | Path) -> Path:
        """``path`` (relative: under ``workdir``) as an absolute host path; ``ValueError`` outside ``root``."""
        target = (self._workdir / path).resolve()
        if not target.is_relative_to(self.root):
            raise ValueError(f"{path} is outside the sandbox {self.root}")
        return target

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.root} is closed")


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process``'s group: it and everything it started (agents spawn shells and tool servers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
