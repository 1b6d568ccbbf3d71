"""``OpenSpielEnv``: the Catch client (OpenEnv ``openspiel_env``'s, with ``EpisodeClient`` sessions)."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult

from harness_grpo.envs.catch.models import OpenSpielAction, OpenSpielObservation, OpenSpielState
from harness_grpo.envs.sessions import EpisodeClient


class OpenSpielEnv(EpisodeClient[OpenSpielAction, OpenSpielObservation, OpenSpielState]):
    """Client of ``python -m harness_grpo.envs catch``: ``reset()``, ``step(OpenSpielAction(action_id=2))``."""

    def _step_payload(self, action: OpenSpielAction) -> dict[str, Any]:
        return {"action_id": action.action_id, "game_name": action.game_name, "game_params": action.game_params}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[OpenSpielObservation]:
        obs = payload.get("observation", {})
        observation = OpenSpielObservation(
            info_state=obs.get("info_state", []),
            legal_actions=obs.get("legal_actions", []),
            game_phase=obs.get("game_phase", "playing"),
            current_player_id=obs.get("current_player_id", 0),
            opponent_last_action=obs.get("opponent_last_action"),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs.get("metadata", {}),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> OpenSpielState:
        return OpenSpielState(
            episode_id=payload.get("episode_id"),
            step_count=payload.get("step_count", 0),
            game_name=payload.get("game_name", "unknown"),
            agent_player=payload.get("agent_player", 0),
            opponent_policy=payload.get("opponent_policy", "random"),
            game_params=payload.get("game_params", {}),
            num_players=payload.get("num_players", 1),
        )
