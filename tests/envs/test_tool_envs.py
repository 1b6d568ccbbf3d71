"""The TRL-style tool classes against the real servers: TRL's discovery rules, whole games, rewards,
the server slot released when a game ends, and the URL taken from the environment for no-argument
construction."""

from __future__ import annotations

import inspect
import pickle
import random

import pytest
from transformers.utils import get_json_schema

from harness_grpo.envs.catch import CatchToolEnv
from harness_grpo.envs.echo import EchoToolEnv
from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.envs.sudoku import SudokuToolEnv
from harness_grpo.envs.sudoku.game import generate
from harness_grpo.envs.wordle import WordleToolEnv
from tests.envs.conftest import launch

TOOLS = {WordleToolEnv: {"guess"}, SudokuToolEnv: {"place"}, CatchToolEnv: {"move", "stay"}, EchoToolEnv: {"echo"}}


def trl_tools(env: object) -> dict[str, object]:
    """TRL's rule: public bound methods other than ``reset`` and ``get_reward``."""
    return {
        name: method
        for name, method in inspect.getmembers(env, inspect.ismethod)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


@pytest.mark.parametrize("cls", list(TOOLS), ids=lambda cls: cls.__name__)
def test_public_methods_are_exactly_the_tools_and_have_schemas(cls: type) -> None:
    tools = trl_tools(cls(base_url="http://127.0.0.1:1"))
    assert set(tools) == TOOLS[cls]
    for name, method in tools.items():
        schema = get_json_schema(method)["function"]
        assert schema["name"] == name and schema["description"]
        assert set(schema["parameters"].get("properties", {})) == set(inspect.signature(method).parameters)


def test_no_argument_construction_reads_the_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORDLE_ENV_URL", raising=False)
    with pytest.raises(ValueError, match="set WORDLE_ENV_URL"):
        WordleToolEnv()
    monkeypatch.setenv("WORDLE_ENV_URL", "http://127.0.0.1:9")
    env = WordleToolEnv()
    assert env.base_url == "http://127.0.0.1:9"
    assert pickle.loads(pickle.dumps(env)).base_url == env.base_url


def test_wordle_game_through_the_tool(servers: dict[str, LocalEnvServer]) -> None:
    env = WordleToolEnv(base_url=servers["wordle"].url)
    opening = env.reset(seed=7, prompt=[{"role": "user", "content": "play"}])  # a dataset row
    assert opening.startswith("[GAME] You are Playing Wordle.") and (env.reward, env.done) == (0.0, False)
    secret = env._client.state().raw_state["game_state"]["secret_word"]
    twin = WordleToolEnv(base_url=servers["wordle"].url)
    twin.reset(seed=7)
    assert twin._client.state().raw_state["game_state"]["secret_word"] == secret  # one group, one game
    twin._close()

    wrong = "crane" if secret != "crane" else "slate"
    feedback = env.guess(wrong)
    assert f"You submitted [{wrong}]." in feedback and "You have 5 guesses left." in feedback
    assert set(env.reward_signals) == {"wordle.greens", "wordle.yellows", "wordle.repetitions", "wordle.correct"}
    assert "already guessed" in env.guess(wrong) and env.reward_signals["wordle.repetitions"] == 0.0
    assert env.guess(secret).endswith("The game is over (reward 1).")
    assert (env.reward, env.done) == (1.0, True)
    with pytest.raises(ValueError, match="game is over"):
        env.guess(secret)
    restored = pickle.loads(pickle.dumps(env))
    assert restored._client is None and restored.base_url == env.base_url
    env._close()


def test_a_finished_game_releases_its_server_slot(start_server) -> None:
    server = start_server("wordle", max_concurrent_envs=1)
    players = [WordleToolEnv(base_url=server.url) for _ in range(3)]
    try:
        for player in players:  # each can start only once the one before has finished
            player.reset(secret_word="apple")
            player.guess("apple")
            assert player.done and player.reward == 1.0
    finally:
        for player in players:
            player._close()


def test_sudoku_game_through_the_tool(servers: dict[str, LocalEnvServer]) -> None:
    solution, puzzle = generate(random.Random(3))
    env = SudokuToolEnv(base_url=servers["sudoku"].url)
    opening = env.reset(seed=3)
    assert "You are playing Sudoku." in opening and "Game Board:" in opening
    empty = [(r, c) for r in range(9) for c in range(9) if puzzle[r][c] == 0]
    clue = next((r, c) for r in range(9) for c in range(9) if puzzle[r][c])
    r, c = empty[0]
    assert env.place(r + 1, c + 1, solution[r][c]).startswith(f"[Player] [{r + 1} {c + 1} {solution[r][c]}]")
    assert "attempted to overwrite a pre-filled cell" in env.place(clue[0] + 1, clue[1] + 1, 5)
    for r, c in empty[1:]:
        reply = env.place(r + 1, c + 1, solution[r][c])
    assert reply.endswith("The game is over (reward 1).") and env.reward == 1.0
    env._close()


def chase(env: CatchToolEnv, board: str) -> str:
    """Move under the ball, then wait for it; the last reply."""
    while not env.done:
        if "to the LEFT" in board:
            board = env.move("left")
        elif "to the RIGHT" in board:
            board = env.move("right")
        else:
            board = env.stay()
    return board


def test_catch_game_through_the_tool(servers: dict[str, LocalEnvServer]) -> None:
    env = CatchToolEnv(base_url=servers["catch"].url)
    seed = next(s for s in range(100) if random.Random(s).randrange(5) == 0)  # ball in the first column
    opening = env.reset(seed=seed)
    assert opening.startswith("Ball: row 1/10, column 1/5\nPaddle: column 3/5")
    assert chase(env, opening).endswith("Caught it! The game is over.") and env.reward == 1.0
    env.reset(seed=seed)
    for _ in range(9):
        reply = env.move("right")
    assert reply.endswith("Missed it. The game is over.") and env.reward == -1.0
    env.reset(seed=seed)
    with pytest.raises(ValueError, match="'left' or 'right'"):
        env.move("up")
    env._close()


def test_echo_through_the_tool(servers: dict[str, LocalEnvServer]) -> None:
    env = EchoToolEnv(base_url=servers["echo"].url)
    assert env.reset() is None
    assert env.echo("Hello World!") == "Hello World!" and env.reward == pytest.approx(1.2)
    env._close()


def test_a_lost_session_surfaces_from_the_tool() -> None:
    server = launch("catch")
    env = CatchToolEnv(base_url=server.url)
    try:
        env.reset(seed=1)
        server.kill()
        with pytest.raises(ConnectionError, match="lost mid-episode"):
            env.stay()
    finally:
        env._close()
        server.stop()
