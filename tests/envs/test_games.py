"""Game behaviour beyond the upstream recordings: seeds, errors upstream does not raise, the CLI."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from harness_grpo.envs.catch import OpenSpielAction, OpenSpielEnv
from harness_grpo.envs.echo import EchoAction, EchoEnv
from harness_grpo.envs.serving import LocalEnvServer, default_max_concurrent_envs
from harness_grpo.envs.sessions import EnvServerError
from harness_grpo.envs.sudoku.game import _count_solutions, generate
from harness_grpo.envs.textarena import TextArenaEnv
from harness_grpo.envs.wordle.words import ANSWERS, VALID_WORDS
from tests.support.processes import REPO_ROOT, repo_env


def test_wordle_seeds_pick_the_secret(servers: dict[str, LocalEnvServer]) -> None:
    with TextArenaEnv(base_url=servers["wordle"].url).sync() as client:

        def secret(**reset: object) -> str:
            client.reset(**reset)
            return client.state().raw_state["game_state"]["secret_word"]

        assert secret(seed=5) == secret(seed=5) == random.Random(5).choice(ANSWERS)
        assert len({secret(seed=seed) for seed in range(8)}) > 1
        assert secret() in ANSWERS
    assert set(ANSWERS) <= VALID_WORDS and all(len(word) == 5 for word in VALID_WORDS)


def test_sudoku_puzzles_are_seeded_and_uniquely_solvable(servers: dict[str, LocalEnvServer]) -> None:
    with TextArenaEnv(base_url=servers["sudoku"].url).sync() as client:
        client.reset(seed=21)
        board = client.state().raw_state["game_state"]["board"]
    solution, puzzle = generate(random.Random(21))
    assert board == puzzle and sum(cell != 0 for row in puzzle for cell in row) == 60
    assert _count_solutions([row[:] for row in puzzle]) == 1
    assert all(puzzle[r][c] in (0, solution[r][c]) for r in range(9) for c in range(9))


def test_catch_refuses_illegal_actions_and_moves_after_the_end(servers: dict[str, LocalEnvServer]) -> None:
    with OpenSpielEnv(base_url=servers["catch"].url).sync() as client:
        first = client.reset(seed=3)
        assert first.reward is None and first.observation.game_phase == "initial"
        assert first.observation.info_state.index(1.0) == random.Random(3).randrange(5)
        with pytest.raises(EnvServerError, match=r"action_id 3 is not legal; legal actions are \[0, 1, 2\]"):
            client.step(OpenSpielAction(action_id=3))
        for _ in range(9):
            last = client.step(OpenSpielAction(action_id=1))
        assert last.done and last.observation.legal_actions == [] and last.observation.current_player_id == -4
        with pytest.raises(EnvServerError, match="the episode is over"):
            client.step(OpenSpielAction(action_id=1))
        assert client.state().step_count == 9


def test_echo_rewards_and_validation(servers: dict[str, LocalEnvServer]) -> None:
    with EchoEnv(base_url=servers["echo"].url).sync() as client:
        client.reset()
        result = client.step(EchoAction(message="TRL is great!"))
        assert (result.observation.echoed_message, result.observation.message_length) == ("TRL is great!", 13)
        assert result.reward == pytest.approx(1.3) and not result.done
        with pytest.raises(EnvServerError) as invalid:
            client._send_and_receive({"type": "step", "data": {"message": ""}})  # what EchoAction refuses to build
        assert invalid.value.code == "VALIDATION_ERROR"


def test_the_command_line_refuses_bad_arguments() -> None:
    for argv, expected in (
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["echo", "--max-concurrent-envs", "0"], "--max-concurrent-envs must be at least 1"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "harness_grpo.envs", *argv],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=repo_env(),
            timeout=60,
        )
        assert done.returncode == 2 and expected in done.stderr


def test_max_concurrent_envs_defaults_to_the_openenv_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAX_CONCURRENT_ENVS", raising=False)
    assert default_max_concurrent_envs() == 64
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "20")
    assert default_max_concurrent_envs() == 20
