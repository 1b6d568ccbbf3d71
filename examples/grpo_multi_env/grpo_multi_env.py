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
"""GRPO on two environments at once, Wordle and Catch, each scored by its own reward functions.

    python examples/grpo_multi_env/grpo_multi_env.py                # CPU: tiny model, local servers
    python examples/grpo_multi_env/grpo_multi_env.py --model Qwen/Qwen3-0.6B \\
        --env-url wordle=http://127.0.0.1:8001 catch=http://127.0.0.1:8002 --vllm_server_base_url http://127.0.0.1:8000

``environment_factory`` is a dict keyed by the rows' ``environment`` column, so a Wordle row's model
sees only ``guess`` and a Catch row's only ``move`` and ``stay``. The reward functions are those of
``grpo_wordle`` and ``grpo_catch``, each returning None for the other environment's rows: a None is
left out of that function's mean, and the weighted sum over functions skips it (TRL's nansum), so
every row is scored by its own game's terms. ``examples/recipe.py`` has the flags.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.grpo_catch import grpo_catch
from examples.grpo_wordle import grpo_wordle
from examples.recipe import Recipe, main

ENVIRONMENTS = {"wordle": grpo_wordle, "catch": grpo_catch}


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` rows alternating between a Wordle game and a Catch game, each tagged with its ``environment``."""
    names = list(ENVIRONMENTS)
    games = {name: module.dataset(-(-size // len(names))) for name, module in ENVIRONMENTS.items()}
    return [
        {**games[names[index % len(names)]][index // len(names)], "environment": names[index % len(names)]}
        for index in range(size)
    ]


def only(name: str, reward_func: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``reward_func`` on the rows of environment ``name`` (every per-row argument cut to those rows); None on
    the others. Per-turn values (a list for a row) pass through as they are."""

    def reward(environment: list[str], **kwargs: Any) -> list[Any]:
        mine = [index for index, row_environment in enumerate(environment) if row_environment == name]
        rows = len(environment)
        cut = {k: [v[i] for i in mine] if isinstance(v, list) and len(v) == rows else v for k, v in kwargs.items()}
        scores: list[Any] = [None] * rows
        for index, score in zip(mine, reward_func(**cut) if mine else [], strict=True):
            scores[index] = score
        return scores

    reward.__name__ = reward_func.__name__
    return reward


RECIPE = Recipe(
    name="grpo_multi_env",
    environment_factory={name: module.RECIPE.environment_factory for name, module in ENVIRONMENTS.items()},
    dataset=dataset,
    reward_funcs=[only(name, func) for name, module in ENVIRONMENTS.items() for func in module.RECIPE.reward_funcs],
    moves={**grpo_wordle.RECIPE.moves, **grpo_catch.RECIPE.moves},
    sft_turns=max(module.RECIPE.sft_turns for module in ENVIRONMENTS.values()),
    settings={"max_completion_length": 4096, "max_tool_calling_iterations": 12, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
