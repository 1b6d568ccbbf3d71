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
"""GRPO on Catch (OpenSpiel's, served offline): move the paddle under the falling ball.

    python examples/grpo_catch/grpo_catch.py                        # CPU: tiny model, local server
    python examples/grpo_catch/grpo_catch.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000

Each rollout is one game through ``CatchToolEnv`` (tools ``move(direction)`` and ``stay()``, one call
per row the ball falls, nine in a game). Two reward terms:

- ``reward_catch``: the game's, +1 caught, -1 missed (a game the model stopped playing counts as missed);
- ``reward_moves``: shaping, per move: each model turn whose move brought the paddle closer to the ball's
  column or kept it under the ball earns 1/9 (a per-turn reward: the function returns one value per model
  turn, and the trainer credits each move with its own), so every game says which moves helped, not only
  whether the last one did; over a game it sums to the share of the nine moves that helped (a game the
  model stops early forfeits the moves it did not make).

With the tiny model (``--model tiny``) ``reward_catch`` weighs 0.25 beside ``reward_moves`` (``reward_weights``):
at equal weights the ±1 of each game drowns the per-move signal a small model learns from first
(``docs/ENVIRONMENTS.md`` has the figures). A row's ``seed`` picks the ball's column, so a GRPO group plays one
game. ``examples/recipe.py`` has the
flags; every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.recipe import Recipe, main
from harness_grpo.envs.catch.server import ROWS
from harness_grpo.envs.catch.tools import CatchToolEnv

BOARD = re.compile(r"column (?P<ball>\d+)/\d+\nPaddle: column (?P<paddle>\d+)/")
SYSTEM_PROMPT = (
    "You play Catch. A ball falls one row per move down a board of 10 rows and 5 columns; your paddle is in "
    "the bottom row. Call move with direction left or right, or stay, once per move, so that the paddle is "
    "under the ball when it lands."
)


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` games; ``reset`` appends the board to the user message."""
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Catch the ball.\n"}]
    return [{"prompt": prompt, "seed": seed} for seed in range(size)]


def reward_moves(
    prompts: list[list[dict[str, Any]]], completions: list[list[dict[str, Any]]], **kwargs: Any
) -> list[list[float | None]]:
    """Shaping, move by move (per-turn rewards): for each model turn, ``1 / (ROWS - 1)`` when its move brought the
    paddle closer to the ball's column or kept it under the ball, 0.0 when it did not, None for a turn that moved
    nothing (no call, a refused call, the game already over). Read off the boards the model saw: the opening one,
    then each move's. Summed over a game it is the share of the game's nine moves that helped; moves not made count
    as unhelpful, so a game stopped after one good move scores 1/9, not 1. The trainer credits each move with its
    own value on top of the game's advantage."""
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        board = BOARD.search(prompt[-1]["content"])
        turns: list[float | None] = []
        for message in completion:
            if message["role"] == "assistant":
                turns.append(None)
                continue
            after = BOARD.search(message["content"] or "")
            if message["role"] != "tool" or after is None or board is None:
                continue
            before_distance = abs(int(board["ball"]) - int(board["paddle"]))
            after_distance = abs(int(after["ball"]) - int(after["paddle"]))
            helped = after_distance < before_distance or after_distance == 0
            turns[-1] = (turns[-1] or 0.0) + helped / (ROWS - 1)  # parallel calls: each move counts
            board = after
        rewards.append(turns)
    return rewards


def reward_catch(environments: list[CatchToolEnv], **kwargs: Any) -> list[float]:
    """The game's reward: +1.0 caught, -1.0 missed; a game the model stopped playing counts as missed."""
    return [environment.reward if environment.done else -1.0 for environment in environments]


RECIPE = Recipe(
    name="grpo_catch",
    environment_factory=CatchToolEnv,
    dataset=dataset,
    reward_funcs=[reward_catch, reward_moves],
    moves={"move": lambda rng: {"direction": rng.choice(["left", "right"])}, "stay": lambda rng: {}},
    sft_turns=12,
    settings={"max_completion_length": 4096, "max_tool_calling_iterations": 12, "max_steps": 30},
    tiny={
        "learning_rate": 2e-4,
        "reward_weights": [0.25, 1.0],
        "loss_weighting": "rollout",
        "groups_per_step": 1,
        "max_staleness": 1,
        "max_steps": 40,
    },
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
