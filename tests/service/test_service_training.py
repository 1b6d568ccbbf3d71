"""``launchers/train.py --env_url`` trains on our rollout service, as a user runs it: three processes on loopback.

The engine (the warm tiny model, behind a recording relay), ``python -m harness_grpo.serve`` in front of it, and the
launcher, whose rollouts are terminus-2 trials in the service's local sandbox and whose weight syncs go to the same
engine. Two steps: every trained rollout's trace is calls the engine served, its reward the verifier's, a weight sync
reached the engine, and the second step's rollouts were served by the new weights only. Flags that make no sense
with a service stop the launcher before anything loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launchers.runs import wait_for_launcher
from tests.launchers.test_train_launcher import _launcher_module
from tests.service.conftest import UNSOLVED, RelayedEngine, make_tasks, start_service

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_launcher_trains_two_steps_on_our_rollout_service(relayed_engine: RelayedEngine, tmp_path: Path) -> None:
    relay = relayed_engine.relay
    dataset = make_tasks(tmp_path)
    service = start_service("ours", dataset, relayed_engine.url, tmp_path)
    try:
        out = tmp_path / "run"
        argv = [
            "--env_url", service.url, "--split", str(dataset), "--harness", "terminus-2", "--sandbox", "local",
            "--vllm_server_base_url", relayed_engine.url,
            "--output_dir", str(out), "--max_steps", "2", "--num_generations", "2",
            "--max_concurrent_rollouts", "2", "--max_staleness", "0", "--max_model_calls", "2",
            "--rollout_timeout_s", "60", "--save_rollouts", "true", "--save_strategy", "no", "--disable_tqdm", "true",
        ]  # fmt: skip
        log = tmp_path / "train.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, str(REPO / "launchers" / "train.py"), *argv],
                cwd=REPO,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        text = wait_for_launcher(process, log, 480)
        assert process.returncode == 0 and "done at step 2" in text, text[-4000:]
    finally:
        service.process.stop()
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == [1, 1, 2, 2], text[-4000:]
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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env_url", "http://127.0.0.1:9", "--harness", "terminus-2"], "--env_url needs --vllm_server_base_url"),
        (["--env_url", "http://127.0.0.1:9"], "--env_url runs Harbor harnesses"),
        (["--harness", "terminus-2", "--split", "x"], "select a rollout service's tasks: pass --env_url"),
        (
            ["--env_url", "http://127.0.0.1:9", "--harness", "terminus-2", "--dataset", "examples/tasks"],
            "--dataset is the rollout service's with --env_url",
        ),
        (
            ["--env_url", "http://127.0.0.1:9", "--harness", "terminus-2", "--vllm_server_base_url", "http://h:1"],
            "cannot start: the rollout service at http://127.0.0.1:9",
        ),
    ],
)
def test_flags_that_cannot_work_with_a_service_stop_the_launcher(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything loads: exit status 2 and one line saying what to do."""
    try:
        code = _launcher_module().main(flags)
    except SystemExit as exit_info:  # the parser's own refusals
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err[-2000:]
