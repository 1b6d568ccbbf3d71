"""Serve the bundled environments, in this process or as a child process.

``python -m harness_grpo.envs NAME [--host H] [--port P] [--max-concurrent-envs N]`` serves one
environment with OpenEnv's ``create_app`` (HTTP ``/reset`` ``/step`` ``/state`` ``/health``
``/schema`` and the ``/ws`` WebSocket, one environment instance per WebSocket session) until
SIGINT/SIGTERM. ``--port 0`` picks a free port; once it accepts connections it prints
``env server ready: URL (NAME, max_concurrent_envs=N)``. ``max_concurrent_envs`` defaults to
``MAX_CONCURRENT_ENVS`` from the environment, else 64; size it at least to the episodes in flight
(plus one for any client that keeps a connection for metadata). ``--exit-with-stdin`` also stops it when its
standard input reaches end of file.

``LocalEnvServer(NAME)`` starts that command as a child process on loopback and waits for the
ready line: ``url`` is where clients connect, ``stop()`` (or leaving the ``with`` block) ends it. The child
runs with ``--exit-with-stdin`` on a pipe from its owner, so it also ends when the owner dies, however.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

ENVIRONMENTS = {
    "echo": "harness_grpo.envs.echo.server",
    "wordle": "harness_grpo.envs.wordle.server",
    "sudoku": "harness_grpo.envs.sudoku.server",
    "catch": "harness_grpo.envs.catch.server",
}
DEFAULT_MAX_CONCURRENT_ENVS = 64
READY = re.compile(r"env server ready: (http://\S+)")


def default_max_concurrent_envs() -> int:
    """``MAX_CONCURRENT_ENVS`` from the environment (OpenEnv's convention), else 64."""
    raw = os.environ.get("MAX_CONCURRENT_ENVS", "")
    return int(raw) if raw.strip() else DEFAULT_MAX_CONCURRENT_ENVS


def build_app(name: str, max_concurrent_envs: int | None = None) -> FastAPI:
    """The FastAPI app of environment ``name`` (one of ``ENVIRONMENTS``)."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENVIRONMENTS)}")
    if max_concurrent_envs is None:
        max_concurrent_envs = default_max_concurrent_envs()
    if max_concurrent_envs < 1:
        raise ValueError(f"max_concurrent_envs must be at least 1, got {max_concurrent_envs}")
    return importlib.import_module(ENVIRONMENTS[name]).create_app(max_concurrent_envs=max_concurrent_envs)


async def _serve(app: FastAPI, sock: socket.socket, banner: str) -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        print(banner, flush=True)
    await serving


def serve(
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_concurrent_envs: int | None = None,
    exit_with_stdin: bool = False,
) -> None:
    """Serve environment ``name`` on ``host:port`` until SIGINT/SIGTERM (``port=0``: a free port), or, with
    ``exit_with_stdin``, until standard input reaches end of file (its owner closed it, or died)."""
    if exit_with_stdin:
        threading.Thread(target=_exit_at_stdin_eof, name="stdin watch", daemon=True).start()
    if max_concurrent_envs is None:
        max_concurrent_envs = default_max_concurrent_envs()
    app = build_app(name, max_concurrent_envs)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if family == socket.AF_INET6 else host
    banner = f"env server ready: http://{shown_host}:{bound_port} ({name}, max_concurrent_envs={max_concurrent_envs})"
    asyncio.run(_serve(app, sock, banner))


def _exit_at_stdin_eof() -> None:
    while sys.stdin.buffer.read(4096):
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own handler shuts the server down


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness_grpo.envs", description="Serve one bundled OpenEnv environment."
    )
    parser.add_argument("name", choices=sorted(ENVIRONMENTS), help="which environment to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    parser.add_argument(
        "--max-concurrent-envs",
        type=int,
        default=None,
        help=f"most WebSocket sessions at once (default: $MAX_CONCURRENT_ENVS or {DEFAULT_MAX_CONCURRENT_ENVS})",
    )
    parser.add_argument(
        "--exit-with-stdin", action="store_true", help="stop when standard input reaches end of file (its owner died)"
    )
    args = parser.parse_args(argv)
    if args.max_concurrent_envs is not None and args.max_concurrent_envs < 1:
        parser.error(f"--max-concurrent-envs must be at least 1, got {args.max_concurrent_envs}")
    serve(args.name, args.host, args.port, args.max_concurrent_envs, args.exit_with_stdin)


class LocalEnvServer:
    """``python -m harness_grpo.envs NAME`` as a child process on loopback; see the module doc."""

    def __init__(
        self,
        name: str,
        *,
        port: int = 0,
        max_concurrent_envs: int | None = None,
        timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> None:
        if name not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENVIRONMENTS)}")
        argv = [sys.executable, "-m", "harness_grpo.envs", name, "--host", "127.0.0.1", "--port", str(port)]
        argv.append("--exit-with-stdin")  # its stdin is our pipe: the server goes when we do, SIGKILL included
        if max_concurrent_envs is not None:
            argv += ["--max-concurrent-envs", str(max_concurrent_envs)]
        self.name = name
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        threading.Thread(target=self._drain, name=f"{name} env server output", daemon=True).start()
        self.url = self._wait_ready(timeout_s)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.kill()
                raise TimeoutError(
                    f"{self.name} env server not ready within {timeout_s}s:\n{''.join(self.output)}"
                ) from None
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"{self.name} env server exited with {code}:\n{''.join(self.output)}")
            if match := READY.search(line):
                return match.group(1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        return self.kill()  # reaps, and closes the stdin pipe

    def kill(self) -> int:
        """SIGKILL (the server dies without closing its sockets) and wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        code = self.proc.wait(30.0)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return code

    def __enter__(self) -> LocalEnvServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
