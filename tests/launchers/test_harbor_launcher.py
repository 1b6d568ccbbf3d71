"""``launchers/train.py`` on Harbor harnesses, as a user runs it: each rollout a Harbor trial in the local sandbox.

For opencode (a CLI installed into the sandbox) and terminus-2 (Harbor's own loop on the host, loaded by import
path) the launcher runs two steps on two example tasks with two trials at once, its engine our embedded one in
another process behind a recording relay (``--vllm_server_base_url``), so the test sees every completion the engine
served and every weight update. From ``--save_rollouts``' log: every trained rollout's trace is what the engine
served (prompt ids, sampled ids and logprobs, call for call), its verifier reward was read, a weight sync was done,
and a session started after it was served by the new weights only. A missing prerequisite stops the launcher before
anything loads.

The launcher hands ``--harness`` to ``HarborTrialSessionFactory`` unchanged, so the other CLIs (claude-code, codex,
mini-swe-agent) differ only inside the factory's trial, which ``tests/harbor/test_harbor_harnesses.py`` runs and
checks for each of the five; a launcher run per CLI would add about 70 s of CI each and test nothing more. But
without ``--model`` the CLIs have a default of their own (the shell-chore SFT model, ``SHELL_CHORE_DEFAULTS``), run
here as ``--difficulty easy`` for mini-swe-agent (its SFT chats written here) and claude-code (captured, and the
longest SFT); opencode's and codex's differ from claude-code's only in the captured request, which
``tests/harbor/test_shell_sft.py`` checks with the models they train.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_grpo.agents import AGENTS, agent_binary
from harness_grpo.harbor_local import check_prerequisites
from harness_grpo.service_loop import ServiceLoop
from tests.agents.conftest import EngineHandle, RecordingRelay, ServedCall, _start_embedded, _stop_process
from tests.launchers.runs import wait_for_launcher

REPO = Path(__file__).resolve().parents[2]
TASKS = ("create-hello-file", "make-directory")


class RelayedEngine:
    """The warm tiny model served by ``python -m harness_grpo.engine`` behind a ``RecordingRelay``."""

    def __init__(self, engine: EngineHandle, relay: RecordingRelay, url: str) -> None:
        self.engine, self.relay, self.url = engine, relay, url


@pytest.fixture
def relayed_engine(tmp_path: Path) -> Iterator[RelayedEngine]:
    """A fresh engine per run: its weight versions start at 0, as the run's own do."""
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    check_prerequisites()
    engine = _start_embedded(tmp_path, model=str(warm_tiny_model_path()))
    loop = ServiceLoop("relay-loop")
    relay = RecordingRelay(engine.url)
    try:
        yield RelayedEngine(engine, relay, loop.run(relay.start()))
    finally:
        loop.run(relay.stop())
        loop.close()
        _stop_process(engine)


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dataset = tmp_path_factory.mktemp("tasks")
    for name in TASKS:
        shutil.copytree(REPO / "examples" / "tasks" / name, dataset / name)
    return dataset


def _run(argv: list[str], log: Path, timeout_s: float) -> str:
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "launchers" / "train.py"), *argv],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    text = wait_for_launcher(process, log, timeout_s)
    assert process.returncode == 0, text[-4000:]
    return text


def _claim_served(turn: dict, served: list[ServedCall], claimed: set[int]) -> int:
    """The index of the call the engine served as ``turn`` (same prompt ids, sampled ids and logprobs), not
    claimed by another turn; the index is added to ``claimed``."""
    for index in range(len(served)):
        call = served[index]
        if (
            index not in claimed
            and call.prompt_ids == turn["prompt_token_ids"]
            and call.completion_ids == turn["completion_token_ids"]
            and call.logprobs == turn["per_token_logps"]
        ):
            claimed.add(index)
            return index
    pytest.fail(f"a captured turn was never served by the engine: prompt of {len(turn['prompt_token_ids'])} ids")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("harness", ["opencode", "terminus-2"])
def test_launcher_trains_a_harbor_harness_on_local_sandbox_trials(
    harness: str, relayed_engine: RelayedEngine, two_tasks: Path, tmp_path: Path
) -> None:
    if harness in AGENTS and agent_binary(harness) is None:
        pytest.skip(f"{harness} is not installed: run launchers/install_agents.sh")
    relay = relayed_engine.relay
    out = tmp_path / "run"
    # Staleness 0: a group started before a weight sync is never trained after it, so the second step
    # trains a group that started, and was served, after the first sync.
    argv = [
        "--harness", harness, "--sandbox", "local", "--dataset", str(two_tasks),
        "--vllm_server_base_url", relayed_engine.url,
        "--output_dir", str(out), "--max_steps", "2", "--num_generations", "2",
        "--max_concurrent_rollouts", "2", "--max_staleness", "0", "--max_model_calls", "3",
        "--save_rollouts", "true", "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    text = _run(argv, tmp_path / "train.log", 360)
    assert "done at step 2" in text, text[-4000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == [1, 1, 2, 2], text[-4000:]
    assert relay.weight_updates, "no weight sync reached the engine"
    first_sync = relay.weight_updates[0]
    served, claimed = relay.served, set()
    for rollout in rollouts:
        assert rollout["error"] is None and rollout["env_reward"] is not None, rollout  # the verifier's reward
        assert rollout["task"] in TASKS
        turns = rollout["trace"]["turns"]
        assert turns, f"{harness} made no model call in {rollout['group_id']}"
        for turn in turns:
            index = _claim_served(turn, served, claimed)
            if rollout["policy_version"] >= 1:  # its group started after the first sync
                assert index >= first_sync, "a session started after the weight sync was served by the old weights"
    assert {r["policy_version"] for r in rollouts if r["step"] == 2} == {1}, rollouts
    assert len(served) >= sum(len(r["trace"]["turns"]) for r in rollouts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", ["mini-swe-agent", "claude-code"])
def test_a_cli_trains_its_shell_chore_model_on_the_easy_tasks_by_default(harness: str, tmp_path: Path) -> None:
    """No ``--model``: the embedded engine serves the tiny model after ``harness``'s shell-chore SFT on the easy
    tasks' instructions, the CLI runs each rollout in the local sandbox, and the verifier scores every one."""
    if agent_binary(harness) is None:
        pytest.skip(f"{harness} is not installed: run launchers/install_agents.sh")
    from harness_grpo.harbor_tasks import load_task_dataset
    from harness_grpo.tiny_model.shell_sft import shell_chore_model

    out = tmp_path / "run"
    argv = [
        "--harness", harness, "--difficulty", "easy", "--output_dir", str(out), "--max_steps", "2",
        "--save_rollouts", "true", "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    text = _run(argv, tmp_path / "train.log", 540)
    assert "done at step 2" in text, text[-4000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 32, text[-4000:]  # SHELL_CHORE_DEFAULTS: four groups of eight a step
    easy = load_task_dataset(REPO / "examples" / "tasks", difficulty="easy")
    assert {r["task"] for r in rollouts} <= set(easy["task_name"])
    model = str(shell_chore_model([row[0]["content"] for row in easy["prompt"]], harness))
    for rollout in rollouts:
        assert rollout["error"] is None and rollout["env_reward"] in (0.0, 1.0), rollout
        turns = rollout["trace"]["turns"]
        assert 1 <= len(turns) <= 2 and all(turn["metadata"]["model"] == model for turn in turns)
    if harness == "mini-swe-agent":  # about one trial in six is rewarded; claude-code's one in twelve may miss 64
        assert any(rollout["env_reward"] == 1.0 for rollout in rollouts), "no trial earned the verifier's reward"
    assert json.loads((out / "log_history.json").read_text())[-1]["step"] == 2


def test_missing_prerequisites_stop_the_launcher_before_anything_loads(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "E2B_API_KEY"}
    run = subprocess.run(
        [sys.executable, str(REPO / "launchers" / "train.py"), "--harness", "opencode", "--sandbox", "e2b"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "E2B_API_KEY" in run.stderr and "proxy_url" not in run.stderr, run.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, str(REPO / "launchers" / "train.py"), "--harness", "opencode", "--dataset", str(empty)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "cannot start" in run.stderr and str(empty) in run.stderr, run.stderr
