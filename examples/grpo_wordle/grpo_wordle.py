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
The reward has three terms, as TRL's Wordle example scores a game; the last two score each model turn
on its own (per-turn rewards: a list per game, one value per model call, summed for the game's value):

- ``reward_win``: 1.0 for a win plus a bonus of 0.1 per guess left unused, else 0.0;
- ``reward_letters``: partial credit for greens plus half the yellows, over five letters, of the game's
  best guess; each turn gets what its guess added to the best so far;
- ``reward_mistakes``: -0.2 on the turn of each repeated or invalid guess (wrong length, not a word,
  already made), and on the turn that stopped a game before it was over, -0.2 per guess left: a game
  given up is no better than one played badly (without it a small model learns to make no guess at all).

A row's ``seed`` picks the secret, so a GRPO group plays one game. ``examples/recipe.py`` has the flags;
every ``HarnessGRPOConfig`` field is one too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
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


@dataclass
class Guess:
    """One guess as the game took it: the word, the feedback the model read, its letter credit (greens plus
    half the yellows, over five letters) and whether it was a mistake (repeated or invalid)."""

    word: str
    feedback: str
    letters: float
    mistake: bool


class WordleGame(WordleToolEnv):
    """``WordleToolEnv`` that also keeps each guess as the reward terms read it (``Guess``), in order."""

    def reset(self, **kwargs: Any) -> str:
        self.guesses: list[Guess] = []
        return super().reset(**kwargs)

    def guess(self, word: str) -> str:
        normalized = word.strip().lower()
        repeated = any(earlier.word == normalized for earlier in self.guesses)
        feedback = super().guess(word)
        mistake = repeated or INVALID in feedback
        letters = 0.0
        if not mistake and self.reward_signals:
            letters = self.reward_signals["wordle.greens"] + 0.5 * self.reward_signals["wordle.yellows"]
        self.guesses.append(Guess(normalized, feedback, letters, mistake))
        return feedback


def dataset(size: int) -> list[dict[str, Any]]:
    """``size`` games; ``reset`` appends the game's opening text to the user message."""
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Let's play.\n"}]
    return [{"prompt": prompt, "seed": seed} for seed in range(size)]


def reward_win(environments: list[WordleGame], **kwargs: Any) -> list[float]:
    """1.0 for a win, plus 0.1 per guess left unused."""
    return [1.0 + 0.1 * (GUESSES - len(env.guesses)) if env.reward == 1.0 else 0.0 for env in environments]


def _turns(completion: list[dict[str, Any]], game: WordleGame) -> list[list[Guess]]:
    """The game's guesses by the model turn that made them (a turn's parallel calls included), read off the
    tool replies in the completion: a reply that is no guess's feedback (a refused call) is none."""
    turns: list[list[Guess]] = []
    pending = iter(game.guesses)
    following = next(pending, None)
    for message in completion:
        if message["role"] == "assistant":
            turns.append([])
        elif message["role"] == "tool" and turns and following is not None and message["content"] == following.feedback:
            turns[-1].append(following)
            following = next(pending, None)
    return turns


def reward_letters(
    completions: list[list[dict[str, Any]]], environments: list[WordleGame], **kwargs: Any
) -> list[list[float | None]]:
    """Per turn, what its guesses added to the game's best letter credit so far (None for a turn without a
    guess); summed over the game, the best guess's greens plus half its yellows, over five letters."""
    rewards = []
    for completion, game in zip(completions, environments, strict=True):
        best, scores = 0.0, []
        for guesses in _turns(completion, game):
            if not guesses:
                scores.append(None)
                continue
            gained = max(best, *(g.letters for g in guesses)) - best
            best += gained
            scores.append(gained)
        rewards.append(scores)
    return rewards


def reward_mistakes(
    completions: list[list[dict[str, Any]]], environments: list[WordleGame], **kwargs: Any
) -> list[list[float | None]]:
    """Per turn, -0.2 per repeated or invalid guess it made; the turn that stopped a game before it was over
    also gets -0.2 per guess left. None for a turn with neither."""
    rewards = []
    for completion, game in zip(completions, environments, strict=True):
        scores: list[float | None] = [
            -0.2 * sum(g.mistake for g in guesses) if guesses else None for guesses in _turns(completion, game)
        ]
        left = GUESSES - len(game.guesses)
        if scores and not game.done and left > 0:
            scores[-1] = (scores[-1] or 0.0) - 0.2 * left
        rewards.append(scores)
    return rewards


RECIPE = Recipe(
    name="grpo_wordle",
    environment_factory=WordleGame,
    dataset=dataset,
    reward_funcs=[reward_win, reward_letters, reward_mistakes],
    moves={"guess": lambda rng: {"word": rng.choice(ANSWERS)}},
    sft_turns=GUESSES,
    settings={"max_completion_length": 4096, "max_tool_calling_iterations": GUESSES, "max_steps": 30},
    tiny={"learning_rate": 3e-4, "max_staleness": 1, "max_steps": 60},
)

if __name__ == "__main__":
    sys.exit(main(RECIPE))
