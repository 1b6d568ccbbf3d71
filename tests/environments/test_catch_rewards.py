"""``grpo_catch``'s reward terms on a game written out as the tool loop records it (boards from ``describe``)."""

from __future__ import annotations

from typing import Any

import pytest

from examples.grpo_catch.grpo_catch import reward_catch, reward_moves
from harness_grpo.envs.catch.server import COLUMNS, ROWS
from harness_grpo.envs.catch.tools import describe


def _board(ball_row: int, ball_column: int, paddle: int) -> str:
    state = [0.0] * (ROWS * COLUMNS)
    state[ball_row * COLUMNS + ball_column] = 1.0
    state[(ROWS - 1) * COLUMNS + paddle] = 1.0
    return describe(state, ball_column)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}


def test_each_move_is_scored_on_its_own_turn_and_the_game_sums_them() -> None:
    prompt = [{"role": "user", "content": "Catch the ball.\n" + _board(0, 3, 1)}]  # ball two columns right
    completion = [
        _call("move", direction="right"),  # closer: 1/9
        {"role": "tool", "content": _board(1, 3, 2)},
        _call("move", direction="left"),  # away: 0
        {"role": "tool", "content": _board(2, 3, 1)},
        _call("move", direction="up"),  # refused: no board, no score
        {"role": "tool", "content": "ValueError: direction must be 'left' or 'right', got 'up'"},
        {"role": "assistant", "content": "Both at once.", "tool_calls": [{}, {}]},  # two moves, both closer
        {"role": "tool", "content": _board(3, 3, 2)},
        {"role": "tool", "content": _board(4, 3, 3)},
        _call("stay"),  # under the ball: 1/9
        {"role": "tool", "content": _board(5, 3, 3)},
        {"role": "assistant", "content": "Done."},  # no move
    ]
    (turns,) = reward_moves([prompt], [completion])
    assert turns == pytest.approx([1 / 9, 0.0, None, 2 / 9, 1 / 9, None])
    assert sum(t for t in turns if t is not None) == pytest.approx(4 / 9)  # the share of nine moves that helped


def test_the_game_reward_counts_an_unfinished_game_as_missed() -> None:
    class Game:
        def __init__(self, done: bool, reward: float) -> None:
            self.done, self.reward = done, reward

    assert reward_catch([Game(True, 1.0), Game(True, -1.0), Game(False, 0.0)]) == [1.0, -1.0, -1.0]
