# /// script
# requires-python = ">=3.12"
# dependencies = [
#     "torch>=2.9,<=2.14.1",
#     "transformers>=5.24,<6",
#     "tokenizers>=0.22",
#     "accelerate>=1.10",
#     "datasets>=4",
#     "huggingface_hub>=1.0",
#     "pydantic>=2.10,<3",
#     "aiohttp>=3.11,<4",
#     "orjson>=3.10",
#     "uvloop>=0.21; sys_platform != 'win32'",
#     "filelock>=3.12",
#     "rich>=13",
#     "harbor==0.25.0",
#     "openenv==0.10.0",
# ]
# ///
"""GRPO on Sudoku (TextArena's ``Sudoku-v0``, served offline): fill the empty cells of a 9x9 puzzle.

    python examples/grpo_sudoku/grpo_sudoku.py                      # CPU: tiny model, local server
    python examples/grpo_sudoku/grpo_sudoku.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000 --max_tool_calling_iterations 100

Each rollout is one puzzle (60 clues, 21 empty cells) through ``SudokuToolEnv`` (one tool,
``place(row, col, number)``). Two reward terms:

- ``reward_filled``: the share of the empty cells the model filled with the solution's digit (1.0 solved);
- ``reward_mistakes``: -0.1 per rejected move (a clue overwritten, a digit that breaks the rules, out of
  bounds). Two rejected moves in a row end the game, as in TextArena.

A row's ``seed`` picks the puzzle, so a GRPO group plays one. ``examples/recipe.py`` has the flags;
every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.recipe import Recipe, main
from harness_grpo.envs.sudoku.game import CLUES
from harness_grpo.envs.sudoku.tools import SudokuToolEnv

EMPTY = 81 - CLUES
ACCEPTED = "Board state:"
SYSTEM_PROMPT = (
    "You play Sudoku. Fill every empty cell ('.') of the 9x9 grid with a digit from 1 to 9 so that each row, "
    "each column and each 3x3 box holds every digit once. Call place with a row, a column and a digit, one "
    "cell at a time. Never overwrite a given digit."
)


class SudokuGame(SudokuToolEnv):
    """``SudokuToolEnv`` that also counts what the reward terms read: cells filled and moves rejected."""

    def reset(self, **kwargs: Any) -> str:
        self.filled = 0
        self.mistakes = 0
        return super().reset(**kwargs)

    def place(self, row: int, col: int, number: int) -> str:
        feedback = super().place(row, col, number)
        if ACCEPTED in feedback:
            self.filled += 1
        else:
            self.mistakes += 1
        return feedback


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` puzzles; ``reset`` appends the game's opening text and grid to the user message."""
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Solve this puzzle.\n"}]
    return [{"prompt": prompt, "seed": seed} for seed in range(size)]


def reward_filled(environments: list[SudokuGame], **kwargs: Any) -> list[float]:
    """The share of the empty cells filled with the solution's digit."""
    return [env.filled / EMPTY for env in environments]


def reward_mistakes(environments: list[SudokuGame], **kwargs: Any) -> list[float]:
    """-0.1 per rejected move."""
    return [-0.1 * env.mistakes for env in environments]


def _cell(rng: Any) -> dict[str, int]:
    return {"row": rng.randint(1, 9), "col": rng.randint(1, 9), "number": rng.randint(1, 9)}


RECIPE = Recipe(
    name="grpo_sudoku",
    environment_factory=SudokuGame,
    dataset=dataset,
    reward_funcs=[reward_filled, reward_mistakes],
    moves={"place": _cell},
    sft_turns=EMPTY,
    settings={"max_completion_length": 8192, "max_tool_calling_iterations": 24, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
