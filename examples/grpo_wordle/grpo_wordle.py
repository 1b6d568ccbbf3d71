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
"""GRPO on Wordle (TextArena's ``Wordle-v0``, served offline): guess the secret five-letter word.

    python examples/grpo_wordle/grpo_wordle.py                      # CPU: tiny model, local server
    python examples/grpo_wordle/grpo_wordle.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000

Each rollout is one game through ``WordleToolEnv`` (one tool, ``guess(word)``, at most six guesses).
The reward has three terms, as TRL's Wordle example scores a game:

- ``reward_win``: 1.0 for a win plus a bonus of 0.1 per guess left unused, else 0.0;
- ``reward_letters``: partial credit from the last accepted guess's feedback, greens plus half the
  yellows, over five letters;
- ``reward_mistakes``: -0.2 for each repeated or invalid guess (wrong length, not a word, already made).

A row's ``seed`` picks the secret, so a GRPO group plays one game. ``examples/recipe.py`` has the flags;
every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.recipe import Recipe, main
from harness_grpo.envs.wordle.tools import WordleToolEnv
from harness_grpo.envs.wordle.words import ANSWERS

GUESSES = 6
INVALID = "You attempted an invalid move"
SYSTEM_PROMPT = (
    "You play Wordle. Guess the secret five-letter English word in at most six guesses by calling guess with "
    "one word at a time. After each guess you see per letter G (right letter, right place), Y (in the word, "
    "elsewhere) or X (not in the word). Never repeat a guess."
)


class WordleGame(WordleToolEnv):
    """``WordleToolEnv`` that also counts what the reward terms read: guesses made, repeated and invalid."""

    def reset(self, **kwargs: Any) -> str:
        self.guesses: list[str] = []
        self.mistakes = 0
        self.letters = 0.0
        return super().reset(**kwargs)

    def guess(self, word: str) -> str:
        repeated = word.strip().lower() in self.guesses
        self.guesses.append(word.strip().lower())
        feedback = super().guess(word)
        if repeated or INVALID in feedback:
            self.mistakes += 1
        elif self.reward_signals:
            self.letters = self.reward_signals["wordle.greens"] + 0.5 * self.reward_signals["wordle.yellows"]
        return feedback


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` games; ``reset`` appends the game's opening text to the user message."""
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Let's play.\n"}]
    return [{"prompt": prompt, "seed": seed} for seed in range(size)]


def reward_win(environments: list[WordleGame], **kwargs: Any) -> list[float]:
    """1.0 for a win, plus 0.1 per guess left unused."""
    return [1.0 + 0.1 * (GUESSES - len(env.guesses)) if env.reward == 1.0 else 0.0 for env in environments]


def reward_letters(environments: list[WordleGame], **kwargs: Any) -> list[float]:
    """Greens plus half the yellows of the last accepted guess, over five letters."""
    return [env.letters for env in environments]


def reward_mistakes(environments: list[WordleGame], **kwargs: Any) -> list[float]:
    """-0.2 per repeated or invalid guess."""
    return [-0.2 * env.mistakes for env in environments]


RECIPE = Recipe(
    name="grpo_wordle",
    environment_factory=WordleGame,
    dataset=dataset,
    reward_funcs=[reward_win, reward_letters, reward_mistakes],
    moves={"guess": lambda rng: {"word": rng.choice(ANSWERS)}},
    sft_turns=GUESSES,
    settings={"max_completion_length": 4096, "max_tool_calling_iterations": GUESSES, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
