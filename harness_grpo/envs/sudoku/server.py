"""The Sudoku server: TextArena's Sudoku-v0 behind OpenEnv's ``create_app``, as ``textarena_env`` serves it.

``reset(seed=None, episode_id=None)``: a new puzzle (``seed`` picks it deterministically);
``step(TextArenaAction(message="[5 3 7]"))``: place 7 at row 5, column 3. See ``game`` for the
rules and ``harness_grpo.envs.textarena.environment`` for the observation format.
"""

from __future__ import annotations

import random

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app as create_openenv_app

from harness_grpo.envs.sudoku.game import SudokuGame
from harness_grpo.envs.textarena.environment import TextArenaGameEnvironment
from harness_grpo.envs.textarena.models import TextArenaAction, TextArenaObservation, TextArenaState


class SudokuEnvironment(TextArenaGameEnvironment):
    """One Sudoku session."""

    env_id = "Sudoku-v0"

    def _new_game(self, rng: random.Random, **_: object) -> SudokuGame:
        return SudokuGame.new(rng)


def create_app(max_concurrent_envs: int) -> FastAPI:
    """The Sudoku server app, one ``SudokuEnvironment`` per WebSocket session."""
    return create_openenv_app(
        SudokuEnvironment,
        TextArenaAction,
        TextArenaObservation,
        env_name="textarena_env",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=TextArenaState,
    )
