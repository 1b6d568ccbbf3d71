"""``EchoEnv``: the echo environment's client (OpenEnv ``echo_env``'s, with ``EpisodeClient`` sessions)."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from harness_grpo.envs.echo.models import EchoAction, EchoObservation
from harness_grpo.envs.sessions import EpisodeClient


class EchoEnv(EpisodeClient[EchoAction, EchoObservation, State]):
    """Client of ``python -m harness_grpo.envs echo``: ``reset()``, ``step(EchoAction(message=...))``."""

    def _step_payload(self, action: EchoAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EchoObservation]:
        obs = payload.get("observation", {})
        observation = EchoObservation(
            echoed_message=obs.get("echoed_message", ""),
            message_length=obs.get("message_length", 0),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs.get("metadata", {}),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))
