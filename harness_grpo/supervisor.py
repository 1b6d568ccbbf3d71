"""Child processes of one job, each in its own process group, all of them gone when the job ends.

``ProcessSupervisor`` starts each child with ``start_new_session=True`` (its own session and process group,
so a kill reaches everything it started: vLLM's engine workers otherwise outlive ``vllm serve`` and keep
the GPU), waits until a child answers HTTP 200 on its health URL (bounded, failing early when the child
exits), watches a main child to its end while the others must stay up, and stops every group: SIGTERM,
a grace period, then SIGKILL. ``stop_all`` runs on leaving the ``with`` block, at interpreter exit
(``atexit``) and, after ``install_signal_handlers``, on SIGTERM/SIGINT/SIGHUP (then the process exits
with 128 + the signal). Each child's output goes to its own log file under ``log_dir``; errors quote its
last lines.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)


class ChildFailed(RuntimeError):
    """A child exited when it should not have, or never became healthy; names it and quotes its log."""


@dataclass
class Child:
    """One started child: ``name``, its ``Popen`` (its pid is its process group id) and its log file."""

    name: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ProcessSupervisor:
    """Starts, watches and stops a job's children (module docstring); ``stop_grace_s`` bounds each SIGTERM."""

    def __init__(self, log_dir: str | Path, *, stop_grace_s: float = 15.0) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stop_grace_s = stop_grace_s
        self.children: list[Child] = []
        self._lock = threading.Lock()
        atexit.register(self.stop_all)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Child:
        """Start ``argv`` in a new process group, output to ``log_dir/<name>.log``; ``env`` replaces the environment."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as output:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        with self._lock:
            self.children.append(child)
        log.info("started %s (pid %d): %s", name, process.pid, " ".join(argv))
        return child

    def wait_healthy(
        self,
        child: Child,
        url: str,
        timeout_s: float,
        *,
        must_stay_up: Sequence[Child] = (),
        interval_s: float = 1.0,
    ) -> float:
        """Block until ``GET url`` answers 200; the seconds it took. ``ChildFailed`` when ``child`` or one of
        ``must_stay_up`` exits first, or ``timeout_s`` passes."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            for other in (child, *must_stay_up):
                code = other.process.poll()
                if code is not None:
                    raise ChildFailed(f"{other.name} exited with {code} before {url} answered:\n{other.log_tail()}")
            if _answers_200(url, timeout_s=max(1.0, interval_s)):
                return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise ChildFailed(f"{child.name}: {url} did not answer 200 within {timeout_s} s:\n{child.log_tail()}")
            time.sleep(interval_s)

    def wait_for(self, main: Child, *, must_stay_up: Sequence[Child] = (), interval_s: float = 0.5) -> int:
        """Block until ``main`` exits; its exit code. ``ChildFailed`` as soon as one of ``must_stay_up`` exits first."""
        while True:
            code = main.process.poll()
            if code is not None:
                return code
            for child in must_stay_up:
                other = child.process.poll()
                if other is not None:
                    raise ChildFailed(
                        f"{child.name} exited with {other} while {main.name} was running:\n{child.log_tail()}"
                    )
            time.sleep(interval_s)

    def stop_all(self) -> None:
        """SIGTERM every child's process group, wait up to ``stop_grace_s``, SIGKILL the groups still there; reap.
        Any thread, any number of times."""
        with self._lock:
            children = list(self.children)
        for child in reversed(children):
            _signal_group(child.pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for child in children:
            while _group_alive(child.pgid) and time.monotonic() < deadline:
                child.process.poll()
                time.sleep(0.05)
            _signal_group(child.pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
        with self._lock:  # stopped groups are forgotten: a later stop must not signal a reused process group id
            self.children = [child for child in self.children if child not in children]

    def install_signal_handlers(self) -> None:
        """On SIGTERM, SIGINT or SIGHUP: stop every child, then exit with 128 + the signal number."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.warning("signal %d: stopping %d children", signum, len(self.children))
            self.stop_all()
            os._exit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, handler)

    def __enter__(self) -> ProcessSupervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


def _answers_200(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (zombies of other parents included until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
