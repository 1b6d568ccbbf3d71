"""Wordle (TextArena Wordle-v0): ``TextArenaEnv`` client, ``TextArenaAction``, ``WordleToolEnv``."""

from harness_grpo.envs.textarena.client import TextArenaEnv
from harness_grpo.envs.textarena.models import TextArenaAction, TextArenaObservation, TextArenaState
from harness_grpo.envs.wordle.tools import WordleToolEnv

__all__ = ["TextArenaAction", "TextArenaEnv", "TextArenaObservation", "TextArenaState", "WordleToolEnv"]
