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
"""GRPO on the echo environment, as TRL's echo example trains it: the environment pays for what it echoes.

    python examples/grpo_echo/grpo_echo.py                          # CPU: tiny model, local server
    python examples/grpo_echo/grpo_echo.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000

Each rollout asks for one echo through ``EchoToolEnv`` (one tool, ``echo(message)``). The reward is the
echo server's own, as in TRL's example: 0.1 per character of the last message echoed, whatever the
prompt asked for, so GRPO learns to echo longer messages (the tiny model's format SFT echoes one of
the five phrases at random; the longest pays 1.9, the shortest 1.2). ``examples/recipe.py`` has the
flags; every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

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
    """``size`` rows cycling through every phrase asked every way."""
    prompts = [ask.format(phrase) for ask in ASKS for phrase in PHRASES]
    return [{"prompt": [{"role": "user", "content": prompts[index % len(prompts)]}]} for index in range(size)]


def reward_echo(environments: list[EchoToolEnv], **kwargs: Any) -> list[float]:
    """The echo server's reward for the last echo (0.1 per character; 0.0 when nothing was echoed)."""
    return [environment.reward for environment in environments]


RECIPE = Recipe(
    name="grpo_echo",
    environment_factory=EchoToolEnv,
    dataset=dataset,
    reward_funcs=[reward_echo],
    moves={"echo": lambda rng: {"message": rng.choice(PHRASES)}},
    sft_turns=1,
    dataset_size=250,
    settings={"max_completion_length": 256, "max_tool_calling_iterations": 1, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
