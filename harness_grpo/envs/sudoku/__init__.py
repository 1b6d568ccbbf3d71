"""Sudoku (TextArena Sudoku-v0): ``TextArenaEnv`` client, ``TextArenaAction``, ``SudokuToolEnv``."""

from harness_grpo.envs.sudoku.tools import SudokuToolEnv
from harness_grpo.envs.textarena.client import TextArenaEnv
from harness_grpo.envs.textarena.models import TextArenaAction, TextArenaObservation, TextArenaState

__all__ = ["SudokuToolEnv", "TextArenaAction", "TextArenaEnv", "TextArenaObservation", "TextArenaState"]
