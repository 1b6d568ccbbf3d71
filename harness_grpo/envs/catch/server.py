"""The Catch server: OpenSpiel's ``catch`` behind OpenEnv's ``create_app``, as ``openspiel_env`` serves it.

The game is OpenSpiel's (10 rows, 5 columns): a ball starts in row 0 of a random column, the
paddle in the middle of the bottom row; each step the ball falls one row and the paddle moves
left (action 0), stays (1) or moves right (2), clamped to the board. When the ball reaches the
bottom row the episode ends with reward +1 if the paddle is under it, else -1; every earlier step
is rewarded 0.0 and ``reset`` has reward None. ``info_state`` is OpenSpiel's observation tensor:
50 floats, row-major, 1.0 at the ball and the paddle. ``current_player_id`` is 0 while playing and
OpenSpiel's terminal id -4 at the end, where ``legal_actions`` is empty; ``game_phase`` is
``initial``, ``playing`` or ``terminal``.

Beyond upstream (which wraps ``open_spiel.python.rl_environment``): ``reset(seed=...)`` picks the
ball's column deterministically; an action id outside ``legal_actions`` is an error (OpenSpiel
applies it unchecked) and so is a step after the episode ended (OpenSpiel silently starts a new
one there).
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app as create_openenv_app
from openenv.core.env_server.interfaces import Environment

from harness_grpo.envs.catch.models import OpenSpielAction, OpenSpielObservation, OpenSpielState

ROWS = 10
COLUMNS = 5
ACTIONS = [0, 1, 2]
TERMINAL_PLAYER_ID = -4


class CatchEnvironment(Environment):
    """One Catch session; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = OpenSpielState(game_name="catch", agent_player=0, opponent_policy="random", num_players=1)
        self._ball: tuple[int, int] | None = None
        self._paddle = COLUMNS // 2

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> OpenSpielObservation:
        self._ball = (0, random.Random(seed).randrange(COLUMNS))
        self._paddle = COLUMNS // 2
        self._state.episode_id = episode_id if episode_id is not None else str(uuid4())
        self._state.step_count = 0
        return self._observation("initial", reward=None)

    def step(self, action: OpenSpielAction, timeout_s: float | None = None, **kwargs: Any) -> OpenSpielObservation:  # type: ignore[override]
        if self._ball is None:
            raise RuntimeError("catch: call reset() before step()")
        if self._terminal:
            raise ValueError("catch: the episode is over; call reset() to start a new one")
        if action.action_id not in ACTIONS:
            raise ValueError(f"catch: action_id {action.action_id} is not legal; legal actions are {ACTIONS}")
        row, column = self._ball
        self._ball = (row + 1, column)
        self._paddle = min(max(self._paddle + action.action_id - 1, 0), COLUMNS - 1)
        self._state.step_count += 1
        if not self._terminal:
            return self._observation("playing", reward=0.0)
        return self._observation("terminal", reward=1.0 if column == self._paddle else -1.0)

    @property
    def state(self) -> OpenSpielState:
        return self._state

    @property
    def _terminal(self) -> bool:
        return self._ball is not None and self._ball[0] >= ROWS - 1

    def _observation(self, phase: str, reward: float | None) -> OpenSpielObservation:
        assert self._ball is not None
        tensor = [0.0] * (ROWS * COLUMNS)
        tensor[self._ball[0] * COLUMNS + self._ball[1]] = 1.0
        tensor[(ROWS - 1) * COLUMNS + self._paddle] = 1.0
        terminal = self._terminal
        return OpenSpielObservation(
            info_state=tensor,
            legal_actions=[] if terminal else list(ACTIONS),
            game_phase=phase,
            current_player_id=TERMINAL_PLAYER_ID if terminal else 0,
            opponent_last_action=None,
            done=terminal,
            reward=reward,
        )


def create_app(max_concurrent_envs: int) -> FastAPI:
    """The Catch server app, one ``CatchEnvironment`` per WebSocket session."""
    return create_openenv_app(
        CatchEnvironment,
        OpenSpielAction,
        OpenSpielObservation,
        env_name="openspiel_env",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=OpenSpielState,
    )
