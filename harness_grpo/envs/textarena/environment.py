"""The OpenEnv side of a TextArena game: observations, rewards and state as ``textarena_env`` serves them.

``TextArenaGameEnvironment`` does what OpenEnv's ``TextArenaEnvironment`` does around a TextArena
game with the default wrappers: the observation's one message is the whole transcript
(``sender_id=-1``, ``category="MESSAGE"``); ``prompt`` is that transcript stripped while no turn
has been completed, else the env id; ``reward`` is the game's reward once it has one, else 0.0;
``info`` and ``metadata`` carry the per-step ``reward_signals`` of the game's reward provider (Wordle's);
``state().raw_state`` is the game's snapshot (its ``game_state`` includes the solution, as upstream).

Beyond upstream: ``reset(seed=...)`` makes the game deterministic (upstream ignores the seed);
a step after the game ended is an error instead of playing on; reset options a game does not
know are ignored, as upstream.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Protocol
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment

from harness_grpo.envs.textarena.game import ROLE_MAPPING, SinglePlayerGame, format_action
from harness_grpo.envs.textarena.models import (
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)


class RewardProvider(Protocol):
    """Per-step reward signals (``textarena_env.rewards.RewardProvider``)."""

    def reset(self) -> None: ...

    def compute(self, *, action: TextArenaAction, observation: TextArenaObservation) -> dict[str, float]: ...


class TextArenaGameEnvironment(Environment):
    """One session of a single-player TextArena game; subclasses name the game (see the module doc)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    env_id: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self._game: SinglePlayerGame | None = None
        self._rewards = self._reward_provider()
        self._last_reward_signals: dict[str, float] = {}
        self._state = TextArenaState(env_id=self.env_id, num_players=1)

    def _new_game(self, rng: random.Random, **options: Any) -> SinglePlayerGame:
        raise NotImplementedError

    def _reward_provider(self) -> RewardProvider | None:
        return None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> TextArenaObservation:
        self._game = self._new_game(random.Random(seed), **options)
        if self._rewards is not None:
            self._rewards.reset()
        self._last_reward_signals = {}
        self._state = TextArenaState(
            episode_id=episode_id if episode_id is not None else str(uuid4()),
            env_id=self.env_id,
            num_players=1,
            raw_state=self._snapshot(),
        )
        observation = self._observation()
        observation.reward = 0.0
        observation.done = False
        return observation

    def step(self, action: TextArenaAction, timeout_s: float | None = None, **kwargs: Any) -> TextArenaObservation:  # type: ignore[override]
        game = self._game
        if game is None:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        if game.done:
            raise ValueError(f"{self.env_id}: the game is over; call reset() to start a new one")
        game.play(format_action(action.message))
        self._state.step_count += 1
        self._state.turn = game.turn
        observation = self._observation()
        observation.done = game.done
        reward = float(game.rewards[0]) if game.rewards else 0.0
        observation.reward = reward
        self._state.last_reward = reward
        signals = self._rewards.compute(action=action, observation=observation) if self._rewards else {}
        if signals:
            observation.info.setdefault("reward_signals", {}).update(signals)
            observation.metadata.setdefault("reward_signals", {}).update(signals)
        self._last_reward_signals = signals
        self._state.last_info = {"reward_signals": signals} if signals else {}
        self._state.raw_state = self._snapshot()
        return observation

    @property
    def state(self) -> TextArenaState:
        return self._state

    def _observation(self) -> TextArenaObservation:
        assert self._game is not None
        transcript = self._game.observe()
        messages = [TextArenaMessage(sender_id=-1, content=transcript, category="MESSAGE")] if transcript else []
        prompt = transcript.strip() if self._game.turn == 0 and transcript else self.env_id
        return TextArenaObservation(
            prompt=prompt,
            messages=messages,
            current_player_id=0,
            legal_players=[0],
            info={},
            metadata={
                "env_id": self.env_id,
                "turn": self._game.turn,
                "raw_messages": [message.model_dump() for message in messages],
            },
        )

    def _snapshot(self) -> dict[str, Any]:
        assert self._game is not None
        game = self._game
        snapshot: dict[str, Any] = {
            "turn": game.turn,
            "game_state": game.game_state,
            "logs": list(game.logs),
            "rewards": game.rewards,
            "done": game.done,
            "role_mapping": dict(ROLE_MAPPING),
            "game_info": game.game_info,
            "step_info": {},
        }
        if self._last_reward_signals:
            snapshot["reward_signals"] = dict(self._last_reward_signals)
        return snapshot
