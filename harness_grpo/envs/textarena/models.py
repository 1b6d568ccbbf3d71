"""TextArena environment types, as OpenEnv's ``textarena_env`` defines them."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, Field


class TextArenaMessage(BaseModel):
    """One message a player observed."""

    sender_id: int
    content: str
    category: str


class TextArenaAction(Action):
    """The player's move, as text (e.g. ``"[crane]"`` in Wordle, ``"[5 3 7]"`` in Sudoku)."""

    message: str


class TextArenaObservation(Observation):
    """What the player sees after a reset or a move."""

    prompt: str
    messages: list[TextArenaMessage] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: list[int] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)


class TextArenaState(State):
    """The server's snapshot of a session."""

    episode_id: str | None = None
    step_count: int = 0
    env_id: str
    num_players: int
    max_turns: int | None = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: dict[str, Any] = Field(default_factory=dict)
    raw_state: dict[str, Any] = Field(default_factory=dict)
