# /// script
# requires-python = ">=3.12"
# dependencies = [
#     "torch>=2.9,<=2.14.1",
#     "transformers>=5.2,<6",
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
"""GRPO on the echo environment: make the environment echo the phrase the user asked for.

    python examples/grpo_echo/grpo_echo.py                          # CPU: tiny model, local server
    python examples/grpo_echo/grpo_echo.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000

TRL's echo example, played through ``EchoToolEnv`` (one tool, ``echo(message)``). The reward is how
close the environment's last echo is to the phrase the prompt asked for (1.0 for the very phrase;
``difflib``'s similarity ratio otherwise; 0.0 when nothing was echoed). The echo server's own reward
(0.1 per character) is not used: it pays for length, whatever was asked. ``examples/recipe.py`` has
the flags; every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.recipe import Recipe, main
from harness_grpo.envs.echo.tools import EchoToolEnv

PHRASES = ["Hello World!", "Goodbye World!", "TRL is great!", "I love RLHF!", "OpenEnv is awesome!"]
ASKS = [
    "Try to echo '{}' in the environment.",
    "Make the environment echo '{}'",
    "Can you ask the environment to echo '{}'?",
    "What happens if you ask the environment to echo '{}'?",
    "Echo '{}' with the echo tool.",
]


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` rows cycling through every phrase asked every way; ``phrase`` is what the reward expects."""
    pairs = [(phrase, ask) for ask in ASKS for phrase in PHRASES]
    rows = []
    for index in range(size):
        phrase, ask = pairs[index % len(pairs)]
        rows.append({"prompt": [{"role": "user", "content": ask.format(phrase)}], "phrase": phrase})
    return rows


def reward_echoed(completions: list[list[dict[str, Any]]], phrase: list[str], **kwargs: Any) -> list[float]:
    """How close the last echo (the last tool message) is to the phrase asked for."""
    rewards = []
    for completion, asked in zip(completions, phrase, strict=True):
        echoes = [message["content"] for message in completion if message["role"] == "tool"]
        rewards.append(difflib.SequenceMatcher(None, echoes[-1], asked).ratio() if echoes else 0.0)
    return rewards


RECIPE = Recipe(
    name="grpo_echo",
    environment_factory=EchoToolEnv,
    dataset=dataset,
    reward_funcs=[reward_echoed],
    moves={"echo": lambda rng: {"message": rng.choice(PHRASES)}},
    sft_turns=1,
    dataset_size=250,
    settings={"max_completion_length": 256, "max_tool_calling_iterations": 1, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
