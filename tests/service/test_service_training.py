"""``launchers/train.py --env_url`` trains on our rollout service, as a user runs it: three processes on loopback.

The engine (the warm tiny model, behind a recording relay), ``python -m harness_grpo.serve`` in front of it, and the
launcher, whose rollouts are terminus-2 trials in the service's local sandbox and whose weight syncs go to the same
engine. Two steps: every trained rollout's trace is calls the engine served, its reward the verifier's, a weight sync
reached the engine, and the second step's rollouts were served by the new weights only. Flags that make no sense
with a service stop the launcher before anything loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launchers.test_train_launcher import _launcher_module
from tests.service.conftest import RelayedEngine, check_two_steps, make_tasks, start_service, train_two_steps


@pytest.mark.timeout(600)
def test_the_launcher_trains_two_steps_on_our_rollout_service(relayed_engine: RelayedEngine, tmp_path: Path) -> None:
    dataset = make_tasks(tmp_path)
    service = start_service("ours", dataset, relayed_engine.url, tmp_path)
    try:
        log = train_two_steps(service, dataset, relayed_engine.url, tmp_path / "run")
    finally:
        service.process.stop()
    check_two_steps(tmp_path / "run", relayed_engine.relay, log)


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
