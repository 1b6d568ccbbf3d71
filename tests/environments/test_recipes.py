"""The ``examples/grpo_<name>`` recipes, each run as users run it: its own process, its own local environment
server, the tiny model after its format SFT, the real trainer, capture proxy and embedded engine.

Every recipe trains two steps; every rollout it trained on is a valid OpenEnv schema-v1 trace whose first
request showed the model exactly its environment's tools, every reward function logged a metric, and the
environment server it started is gone afterwards. Against a server the test started (``--env-url``), the
recipe starts none of its own and its games are played there.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from examples.grpo_multi_env import grpo_multi_env
from examples.recipe import server_urls
from harness_grpo.envs.serving import LocalEnvServer
from proxy.capture_graph import sequences_from_trace
from proxy.trace import TrainingTrace
from tests.launchers.runs import wait_for_launcher

REPO = Path(__file__).resolve().parents[2]
TOOLS = {"echo": ["echo"], "wordle": ["guess"], "catch": ["move", "stay"], "sudoku": ["place"]}
REWARDS = {
    "echo": ["reward_echo"],
    "wordle": ["reward_win", "reward_letters", "reward_mistakes"],
    "catch": ["reward_catch", "reward_moves"],
    "sudoku": ["reward_filled", "reward_mistakes"],
    "multi_env": ["reward_win", "reward_letters", "reward_mistakes", "reward_catch", "reward_moves"],
}
SMALL = [
    "--max_steps", "2", "--num_generations", "2", "--groups_per_step", "1", "--max_staleness", "0",
    "--max_tool_calling_iterations", "3", "--max_completion_length", "1024", "--sft_episodes", "8",
    "--sft_steps", "4", "--dataset_size", "8", "--save_rollouts", "true",
]  # fmt: skip
SERVER_LINE = re.compile(r"^(\w+) environment server: (http://127\.0\.0\.1:\d+)$", re.M)


def _run(name: str, tmp_path: Path, *extra: str) -> tuple[str, Path]:
    output = tmp_path / name
    log = tmp_path / f"{name}.log"
    script = REPO / "examples" / f"grpo_{name}" / f"grpo_{name}.py"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), *SMALL, "--output_dir", str(output), *extra],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        text = wait_for_launcher(process, log, timeout_s=540)
    assert process.returncode == 0, text[-4000:]
    return text, output


def _rollouts(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "rollouts.jsonl").read_text().splitlines()]


def _check_training(name: str, output: Path, per_step: int = 2) -> list[dict[str, Any]]:
    """Two logged steps with every reward function's metric; the trained rollouts' traces valid."""
    history = json.loads((output / "log_history.json").read_text())
    assert [entry["step"] for entry in history] == [1, 2]
    for entry in history:
        assert entry["rollout/errors"] == 0
        for reward in REWARDS[name]:
            assert f"rewards/{reward}/mean" in entry, sorted(entry)
    rollouts = _rollouts(output)
    assert [rollout["step"] for rollout in rollouts] == [1] * per_step + [2] * per_step
    for rollout in rollouts:
        trace = TrainingTrace.from_json(json.dumps(rollout["trace"]))
        assert trace.turns and sequences_from_trace(trace)
        assert all(turn.completion_token_ids for turn in trace.turns)
    return rollouts


def _shown_tools(rollout: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in rollout["trace"]["turns"][0]["request"]["tools"]]


def _gone(url: str) -> bool:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
        except (urllib.error.URLError, OSError):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["wordle", "catch", "sudoku"])
def test_a_game_recipe_trains_two_steps_on_the_server_it_starts(name: str, tmp_path: Path) -> None:
    text, output = _run(name, tmp_path)
    (server,) = SERVER_LINE.findall(text)
    assert server[0] == name and _gone(server[1])  # started for the run, stopped at its end
    for rollout in _check_training(name, output):
        assert _shown_tools(rollout) == TOOLS[name]
    assert re.search(r"^reward: first 2 steps -?\d+\.\d+ -> last 2 steps -?\d+\.\d+$", text, re.M)


@pytest.mark.timeout(600)
def test_the_multi_env_recipe_shows_each_row_only_its_environment_s_tools(tmp_path: Path) -> None:
    # One group at a time, in dataset order (Wordle, Catch, ...): each step trains one group of each.
    text, output = _run("multi_env", tmp_path, "--groups_per_step", "2", "--max_concurrent_rollouts", "2")
    assert sorted(server for server, _ in SERVER_LINE.findall(text)) == ["catch", "wordle"]
    seen = set()
    for rollout in _check_training("multi_env", output, per_step=4):
        tools = _shown_tools(rollout)
        environment = "wordle" if tools == TOOLS["wordle"] else "catch"
        assert tools == TOOLS[environment]
        seen.add(environment)
        if environment == "catch":  # the Wordle terms answered None for it: the game's (+-1) and a share of moves
            assert -1.0 <= rollout["reward"] <= 2.0
        else:
            assert math.isfinite(rollout["reward"])
    assert seen == {"wordle", "catch"}


@pytest.mark.timeout(600)
def test_the_echo_recipe_plays_on_a_given_server_and_starts_none(tmp_path: Path) -> None:
    with LocalEnvServer("echo") as server:
        text, output = _run("echo", tmp_path, "--env-url", server.url)
        assert not SERVER_LINE.findall(text)
        rollouts = _check_training("echo", output)
        for rollout in rollouts:
            assert _shown_tools(rollout) == ["echo"]
        assert server.proc.poll() is None


def test_a_recipe_refuses_an_env_url_for_a_server_it_does_not_use(tmp_path: Path) -> None:
    script = REPO / "examples" / "grpo_multi_env" / "grpo_multi_env.py"
    result = subprocess.run(
        [sys.executable, str(script), "--env-url", "http://127.0.0.1:9", "--output_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2  # before any model, server or SFT
    assert "this recipe uses wordle, catch; write NAME=URL" in result.stderr
    assert server_urls(grpo_multi_env.RECIPE, ["wordle=http://a:1", "catch=http://b:2"]) == {
        "wordle": "http://a:1",
        "catch": "http://b:2",
    }
    assert server_urls(grpo_multi_env.RECIPE, ["catch=http://b:2"]) == {"wordle": None, "catch": "http://b:2"}
    with pytest.raises(ValueError, match="not 'sudoku'"):
        server_urls(grpo_multi_env.RECIPE, ["sudoku=http://127.0.0.1:9"])
