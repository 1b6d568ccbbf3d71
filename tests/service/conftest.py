"""The rollout services under test, on loopback: ``openenv harbor serve`` and ours, in front of one engine.

``relayed_engine`` is the warm tiny model (``python -m harness_grpo.engine``; ``$HARNESS_AGENT_ENGINE_MODEL`` names
another) behind a ``RecordingRelay``, so a test
sees every completion the engine served. ``start_service(kind, ...)`` starts a service as a user does, in its own
process: ``openenv`` is OpenEnv's ``openenv harbor serve`` (through ``python -m harness_grpo.openenv_harbor``, which
only adds the local sandbox), ``ours`` is ``python -m harness_grpo.serve``; both with ``--expose direct`` semantics,
the engine at ``--llm-url``, ``--max-output-tokens`` small for the tiny model, and at most ``max_concurrent``
env sessions. ``make_tasks`` writes a dataset of two tasks with distinct instructions whose verifier writes 1 when
``/app/answer.txt`` holds 42, else ``UNSOLVED``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness_grpo.harbor_local import check_prerequisites
from harness_grpo.service_loop import ServiceLoop
from tests.agents.conftest import EngineHandle, RecordingRelay, _embedded_model, _start_embedded, _stop_process
from tests.sandbox.conftest import make_task
from tests.support.processes import ReadyProcess, repo_env

UNSOLVED = 0.25
VERIFIER = f"""\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo {UNSOLVED}; fi > /logs/verifier/reward.txt
"""
READY = r"Uvicorn running on http://\S+"
MAX_OUTPUT_TOKENS = 48
SERVICES = ("openenv", "ours")


@dataclass
class RelayedEngine:
    engine: EngineHandle
    relay: RecordingRelay
    url: str


@dataclass
class Service:
    """A running rollout service: its env server URL, its capture proxy's port, its process."""

    kind: str
    url: str
    capture_port: int
    process: ReadyProcess

    @property
    def capture_url(self) -> str:
        return f"http://127.0.0.1:{self.capture_port}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_tasks(parent: Path) -> Path:
    """Two tasks, ``answer-a`` and ``answer-b``, that differ in their instruction only."""
    dataset = parent / "tasks"
    dataset.mkdir()
    for name in ("answer-a", "answer-b"):
        task = make_task(dataset, name, test=VERIFIER, agent_timeout_s=60.0)
        (task / "instruction.md").write_text(f"Write 42 into /app/answer.txt ({name}).\n")
    return dataset


def start_service(
    kind: str, dataset: Path, llm_url: str, log_dir: Path, *, max_concurrent: int = 2, timeout_s: float = 240.0
) -> Service:
    """``kind`` (``openenv`` or ``ours``) serving ``dataset`` on free loopback ports, once it serves."""
    port, capture_port = free_port(), free_port()
    module = "harness_grpo.openenv_harbor" if kind == "openenv" else "harness_grpo.serve"
    argv = [sys.executable, "-m", module, *(["serve"] if kind == "openenv" else [])]
    argv += ["--dataset", str(dataset), "--llm-url", llm_url, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--capture-port", str(capture_port), "--expose", "direct", "--max-output-tokens", str(MAX_OUTPUT_TOKENS)]
    env = repo_env(
        MAX_CONCURRENT_ENVS=str(max_concurrent),
        ENABLE_WEB_INTERFACE="false",  # openenv's Gradio UI: not what is tested, and slow to import
        OPENENV_HARBOR_TRIALS_DIR=str(log_dir / f"{kind}-trials"),
        HARBOR_TELEMETRY="0",
    )
    process = ReadyProcess(argv, READY, timeout_s=timeout_s, log_path=log_dir / f"{kind}.log", env=env)
    return Service(kind, f"http://127.0.0.1:{port}", capture_port, process)


@pytest.fixture(scope="module")
def relayed_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayedEngine]:
    check_prerequisites()
    engine = _start_embedded(tmp_path_factory.mktemp("engine"), model=_embedded_model())
    loop = ServiceLoop("relay-loop")
    relay = RecordingRelay(engine.url)
    try:
        yield RelayedEngine(engine, relay, loop.run(relay.start()))
    finally:
        loop.run(relay.stop())
        loop.close()
        _stop_process(engine)
