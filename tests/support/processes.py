"""Subprocesses the tests start and wait for: one way to start them, read their output and stop them.

``ReadyProcess(argv, ready)`` starts ``argv`` in the repository root with the repository on
``PYTHONPATH`` (so a worktree's code wins in the child too), reads its stdout and stderr on a
thread (the child never blocks on a full pipe), and returns once a line matches the ``ready``
pattern; ``match`` is that line's match. It raises, with the output so far, when the child exits
or ``timeout_s`` passes first. ``stop()`` sends SIGTERM, waits, kills after a deadline and returns
the exit code; ``kill()`` sends SIGKILL. Output is kept in ``output`` (and appended to
``log_path`` when given).

``start_engine(*cli_args)`` is ``python -m harness_grpo.engine --host 127.0.0.1 --port 0
*cli_args`` ready at its ``engine ready: URL`` line; ``url`` is that URL.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_READY = re.compile(r"engine ready: (http://\S+)")


def repo_env(**extra: str) -> dict[str, str]:
    """``os.environ`` with the repository first on ``PYTHONPATH``, plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


class ReadyProcess:
    """A child process that has printed its ready line; see the module docstring."""

    def __init__(
        self,
        argv: Sequence[str],
        ready: str | re.Pattern[str],
        *,
        timeout_s: float = 120.0,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log: IO[str] | None = log_path.open("w") if log_path is not None else None
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env or repo_env(),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._drain, name=f"output of {self.argv[1:3]}", daemon=True)
        self._reader.start()
        pattern = re.compile(ready) if isinstance(ready, str) else ready
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.kill()
                raise TimeoutError(f"{self.argv} not ready within {timeout_s}s:\n{self.text}") from None
            if line is None:  # end of output: the child exited
                code = self.stop(10.0)
                raise RuntimeError(f"{self.argv} exited with {code} before it was ready:\n{self.text}")
            if match := pattern.search(line):
                self.match = match
                return

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def text(self) -> str:
        """All output read so far."""
        return "".join(self.output)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            self._lines.put(line)
        self._lines.put(None)
        if self._log is not None:
            self._log.close()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait ``timeout_s``, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait(timeout_s)

    def kill(self, timeout_s: float = 30.0) -> int:
        """SIGKILL and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout_s)

    def __enter__(self) -> ReadyProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class EngineProcess(ReadyProcess):
    """``python -m harness_grpo.engine`` once it serves; ``url`` is its base URL (no ``/v1``)."""

    @property
    def url(self) -> str:
        return self.match.group(1)


def start_engine(*cli_args: str, timeout_s: float = 120.0, log_path: Path | None = None) -> EngineProcess:
    """``python -m harness_grpo.engine --host 127.0.0.1 --port 0 *cli_args``, once it serves."""
    argv = [sys.executable, "-m", "harness_grpo.engine", "--host", "127.0.0.1", "--port", "0", *cli_args]
    return EngineProcess(argv, ENGINE_READY, timeout_s=timeout_s, log_path=log_path)
