"""``TextArenaEnv``: the TextArena client (OpenEnv ``textarena_env``'s, with ``EpisodeClient`` sessions)."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult

from harness_grpo.envs.sessions import EpisodeClient
from harness_grpo.envs.textarena.models import (
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)


class TextArenaEnv(EpisodeClient[TextArenaAction, TextArenaObservation, TextArenaState]):
    """Client of the Wordle and Sudoku servers: ``reset()``, ``step(TextArenaAction(message="[crane]"))``.

    ``observation.messages[0].content`` is the whole game transcript so far, as TextArena's LLM
    observation wrapper writes it (each move appends to it).
    """

    def _step_payload(self, action: TextArenaAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TextArenaObservation]:
        obs = payload.get("observation", {})
        messages = [
            TextArenaMessage(
                sender_id=item.get("sender_id", -1),
                content=item.get("content", ""),
                category=item.get("category", "MESSAGE"),
            )
            for item in obs.get("messages", [])
            if isinstance(item, dict)
        ]
        observation = TextArenaObservation(
            prompt=obs.get("prompt", ""),
            messages=messages,
            current_player_id=obs.get("current_player_id", 0),
            legal_players=obs.get("legal_players", []),
            info=obs.get("info", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=obs.get("metadata", {}),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> TextArenaState:
        return TextArenaState(
            episode_id=payload.get("episode_id"),
            step_count=payload.get("step_count", 0),
            env_id=payload.get("env_id", "unknown"),
            num_players=payload.get("num_players", 1),
            max_turns=payload.get("max_turns"),
            turn=payload.get("turn", 0),
            last_reward=payload.get("last_reward", 0.0),
            last_info=payload.get("last_info", {}),
            raw_state=payload.get("raw_state", {}),
        )
