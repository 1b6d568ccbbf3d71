"""OpenSpiel environment types, as OpenEnv's ``openspiel_env`` defines them."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class OpenSpielAction(Action):
    """The action to take: an id from the observation's ``legal_actions`` (Catch: 0 left, 1 stay, 2 right)."""

    action_id: int
    game_name: str = "catch"
    game_params: dict[str, Any] = Field(default_factory=dict)


class OpenSpielObservation(Observation):
    """The agent's view: the observation tensor, the legal actions and the game phase."""

    info_state: list[float]
    legal_actions: list[int]
    game_phase: str = "playing"
    current_player_id: int = 0
    opponent_last_action: int | None = None


class OpenSpielState(State):
    """The server's snapshot of a session."""

    game_name: str = "catch"
    agent_player: int = 0
    opponent_policy: str = "random"
    game_params: dict[str, Any] = Field(default_factory=dict)
    num_players: int = 1
