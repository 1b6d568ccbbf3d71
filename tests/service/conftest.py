"""The rollout services under test, on loopback: ``openenv harbor serve`` and ours, in front of one engine.

``relayed_engine`` is the warm tiny model (``python -m harness_grpo.engine``; ``$HARNESS_AGENT_ENGINE_MODEL`` names
another) behind a ``RecordingRelay``, so a test
sees every completion the engine served. ``start_service(kind, ...)`` starts a service as a user does, in its own
process: ``openenv`` is OpenEnv's ``openenv harbor serve`` (through ``python -m harness_grpo.openenv_harbor``, which
only adds the local sandbox), ``ours`` is ``python -m harness_grpo.serve``; both with ``--expose direct`` semantics,
the engine at ``--llm-url``, ``--max-output-tokens`` small for the tiny model, and at most ``max_concurrent``
env sessions; given ``proxy_base_url``, ours uses that capture proxy (``start_proxy``: ``python -m proxy`` alone, with
an admin key) instead of its own. ``make_tasks`` writes a dataset of two tasks with distinct instructions whose
verifier writes 1 when ``/app/answer.txt`` holds 42, else ``UNSOLVED``. ``train_two_steps`` runs
``launchers/train.py --env_url`` on a service and ``check_two_steps`` checks what it logged.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness_grpo.harbor_local import check_prerequisites
from harness_grpo.service_loop import ServiceLoop
from tests.agents.conftest import EngineHandle, RecordingRelay, _embedded_model, _start_embedded, _stop_process
from tests.launchers.runs import wait_for_launcher
from tests.sandbox.conftest import make_task
from tests.support.processes import REPO_ROOT, ReadyProcess, repo_env

UNSOLVED = 0.25
VERIFIER = f"""\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo {UNSOLVED}; fi > /logs/verifier/reward.txt
"""
READY = r"Uvicorn running on http://\S+"
PROXY_READY = r"proxy listening on (http://\S+)"
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


def service_argv(kind: str, dataset: Path, llm_url: str, port: int, *, proxy_base_url: str | None = None) -> list[str]:
    """The command line of ``kind`` serving ``dataset`` on loopback ``port``: with its own capture proxy on a free
    port, or (ours only) with the one at ``proxy_base_url``."""
    module = "harness_grpo.openenv_harbor" if kind == "openenv" else "harness_grpo.serve"
    argv = [sys.executable, "-m", module, *(["serve"] if kind == "openenv" else [])]
    argv += ["--dataset", str(dataset), "--llm-url", llm_url, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--expose", "direct", "--max-output-tokens", str(MAX_OUTPUT_TOKENS)]
    if proxy_base_url is None:
        return [*argv, "--capture-port", str(free_port())]
    return [*argv, "--proxy-base-url", proxy_base_url]


def service_env(kind: str, log_dir: Path, *, max_concurrent: int = 2, admin_key: str | None = None) -> dict[str, str]:
    """The environment a service runs in; ``admin_key`` is ``$HARNESS_PROXY_ADMIN_KEY`` (None: unset)."""
    env = repo_env(
        MAX_CONCURRENT_ENVS=str(max_concurrent),
        ENABLE_WEB_INTERFACE="false",  # openenv's Gradio UI: not what is tested, and slow to import
        OPENENV_HARBOR_TRIALS_DIR=str(log_dir / f"{kind}-trials"),
        HARBOR_TELEMETRY="0",
    )
    env.pop("HARNESS_PROXY_ADMIN_KEY", None)
    return env if admin_key is None else {**env, "HARNESS_PROXY_ADMIN_KEY": admin_key}


def start_service(
    kind: str,
    dataset: Path,
    llm_url: str,
    log_dir: Path,
    *,
    max_concurrent: int = 2,
    timeout_s: float = 240.0,
    proxy_base_url: str | None = None,
    admin_key: str | None = None,
) -> Service:
    """``kind`` (``openenv`` or ``ours``) serving ``dataset`` on free loopback ports, once it serves; given
    ``proxy_base_url``, ours with that proxy and ``admin_key`` as its admin key."""
    port = free_port()
    argv = service_argv(kind, dataset, llm_url, port, proxy_base_url=proxy_base_url)
    env = service_env(kind, log_dir, max_concurrent=max_concurrent, admin_key=admin_key)
    process = ReadyProcess(argv, READY, timeout_s=timeout_s, log_path=log_dir / f"{kind}.log", env=env)
    capture_port = urlsplit(proxy_base_url).port if proxy_base_url else int(argv[argv.index("--capture-port") + 1])
    assert capture_port is not None
    return Service(kind, f"http://127.0.0.1:{port}", capture_port, process)


def start_proxy(engine_url: str, log_dir: Path, *, admin_key: str) -> ReadyProcess:
    """``python -m proxy`` alone in front of ``engine_url`` on a free loopback port with ``admin_key``, once it
    listens; ``match.group(1)`` is its URL."""
    argv = [sys.executable, "-m", "proxy", "--engine-url", engine_url, "--journal-dir", str(log_dir / "journal")]
    argv += ["--port", "0", "--admin-key", admin_key]
    return ReadyProcess(argv, PROXY_READY, log_path=log_dir / "proxy.log")


def train_two_steps(service: Service, dataset: Path, engine_url: str, out: Path, timeout_s: float = 480.0) -> str:
    """``launchers/train.py --env_url`` on ``service``: two steps of two terminus-2 rollouts of ``dataset``'s tasks
    in its local sandbox, two calls each, weights synced to ``engine_url``, rollouts logged under ``out``; its log,
    once it exited 0 after step 2."""
    argv = [
        "--env_url", service.url, "--split", str(dataset), "--harness", "terminus-2", "--sandbox", "local",
        "--vllm_server_base_url", engine_url,
        "--output_dir", str(out), "--max_steps", "2", "--num_generations", "2",
        "--max_concurrent_rollouts", "2", "--max_staleness", "0", "--max_model_calls", "2",
        "--rollout_timeout_s", "60", "--save_rollouts", "true", "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    log = out.parent / f"{out.name}.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "launchers" / "train.py"), *argv],
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    text = wait_for_launcher(process, log, timeout_s)
    assert process.returncode == 0 and "done at step 2" in text, text[-4000:]
    return text


def check_two_steps(out: Path, relay: RecordingRelay, log: str) -> None:
    """What ``train_two_steps`` logged: every trained rollout's trace is calls the engine served, its reward the
    verifier's, a weight sync reached the engine, and the second step's rollouts were served by the new weights."""
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == [1, 1, 2, 2], log[-4000:]
    assert relay.weight_updates, "no weight sync reached the engine"
    first_sync, served = relay.weight_updates[0], relay.served
    for rollout in rollouts:
        assert rollout["error"] is None and rollout["env_reward"] == UNSOLVED, rollout
        turns = rollout["trace"]["turns"]
        assert len(turns) == 2, rollout  # terminus-2's turns end with the call budget
        for turn in turns:
            index = next(
                i
                for i, call in enumerate(served)
                if (call.prompt_ids, call.completion_ids, call.logprobs)
                == (turn["prompt_token_ids"], turn["completion_token_ids"], turn["per_token_logps"])
            )
            if rollout["policy_version"] >= 1:
                assert index >= first_sync, "a rollout started after the weight sync was served by the old weights"
    assert {r["policy_version"] for r in rollouts if r["step"] == 2} == {1}, rollouts


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
