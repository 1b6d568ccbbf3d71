"""TextArena-format pieces shared by the Wordle and Sudoku servers: types, client, game state."""

from harness_grpo.envs.textarena.client import TextArenaEnv
from harness_grpo.envs.textarena.models import (
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)

__all__ = ["TextArenaAction", "TextArenaEnv", "TextArenaMessage", "TextArenaObservation", "TextArenaState"]
