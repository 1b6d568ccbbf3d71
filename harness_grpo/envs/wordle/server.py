"""The Wordle server: TextArena's Wordle-v0 behind OpenEnv's ``create_app``, as ``textarena_env`` serves it.

``reset(seed=None, episode_id=None, secret_word=None)``: a new game, its secret drawn by ``seed``
(or given); ``step(TextArenaAction(message="[crane]"))``: one guess. See ``game`` for the rules
and ``harness_grpo.envs.textarena.environment`` for the observation format.
"""

from __future__ import annotations

import random

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app as create_openenv_app

from harness_grpo.envs.textarena.environment import TextArenaGameEnvironment
from harness_grpo.envs.textarena.models import TextArenaAction, TextArenaObservation, TextArenaState
from harness_grpo.envs.wordle.game import WordleGame
from harness_grpo.envs.wordle.rewards import WordleRewardProvider


class WordleEnvironment(TextArenaGameEnvironment):
    """One Wordle session."""

    env_id = "Wordle-v0"

    def _new_game(self, rng: random.Random, secret_word: str | None = None, **_: object) -> WordleGame:
        return WordleGame.new(rng, secret_word)

    def _reward_provider(self) -> WordleRewardProvider:
        return WordleRewardProvider()


def create_app(max_concurrent_envs: int) -> FastAPI:
    """The Wordle server app, one ``WordleEnvironment`` per WebSocket session."""
    return create_openenv_app(
        WordleEnvironment,
        TextArenaAction,
        TextArenaObservation,
        env_name="textarena_env",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=TextArenaState,
    )
