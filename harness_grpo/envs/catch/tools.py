"""``CatchToolEnv``: Catch as a TRL ``environment_factory`` class."""

from __future__ import annotations

from typing import Any

from harness_grpo.envs.catch.client import OpenSpielEnv
from harness_grpo.envs.catch.models import OpenSpielAction
from harness_grpo.envs.catch.server import COLUMNS, ROWS
from harness_grpo.envs.tool_env import EpisodeToolEnv

LEFT, STAY, RIGHT = 0, 1, 2


def describe(info_state: list[float], ball_column: int) -> str:
    """The ball's and the paddle's positions (1-based) and where the ball is relative to the paddle.

    ``ball_column`` (0-based) tells the ball from the paddle once both are in the bottom row.
    """
    ball_row = next((index // COLUMNS for index, value in enumerate(info_state) if value == 1.0), ROWS - 1)
    bottom = [column for column in range(COLUMNS) if info_state[(ROWS - 1) * COLUMNS + column] == 1.0]
    others = [column for column in bottom if column != ball_column or ball_row < ROWS - 1]
    paddle = others[0] if others else ball_column
    parts = [
        f"Ball: row {ball_row + 1}/{ROWS}, column {ball_column + 1}/{COLUMNS}",
        f"Paddle: column {paddle + 1}/{COLUMNS}",
    ]
    offset = ball_column - paddle
    if offset < 0:
        parts.append(f"The ball is {-offset} column(s) to the LEFT of the paddle.")
    elif offset > 0:
        parts.append(f"The ball is {offset} column(s) to the RIGHT of the paddle.")
    else:
        parts.append("The ball is directly above the paddle.")
    return "\n".join(parts)


class CatchToolEnv(EpisodeToolEnv):
    """Tools ``move`` and ``stay``. ``reward`` is the game's: +1.0 caught, -1.0 missed, 0.0 while falling.

    The server URL is ``base_url=`` or ``$CATCH_ENV_URL``; a row's ``seed`` picks the ball's column.
    """

    url_variable = "CATCH_ENV_URL"
    server_name = "catch"
    client_class = OpenSpielEnv

    def reset(self, **kwargs: Any) -> str:
        """Start a new game on its own server session and describe the board."""
        seed = kwargs.get("seed")
        result = self._start_episode(**({} if seed is None else {"seed": seed}))
        self._ball_column = result.observation.info_state.index(1.0)
        return describe(result.observation.info_state, self._ball_column)

    def move(self, direction: str) -> str:
        """Move the paddle one column left or right while the ball falls one row.

        Args:
            direction: "left" or "right".

        Returns:
            The board after the move.
        """
        if direction not in ("left", "right"):
            raise ValueError(f"direction must be 'left' or 'right', got {direction!r}")
        return self._act(LEFT if direction == "left" else RIGHT)

    def stay(self) -> str:
        """Keep the paddle where it is while the ball falls one row.

        Returns:
            The board after the move.
        """
        return self._act(STAY)

    def _act(self, action_id: int) -> str:
        result = self._play(OpenSpielAction(action_id=action_id, game_name="catch"))
        text = describe(result.observation.info_state, self._ball_column)
        if result.done:
            text += "\nCaught it! The game is over." if self.reward > 0 else "\nMissed it. The game is over."
        return text
