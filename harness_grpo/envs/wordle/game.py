"""Wordle-v0 as TextArena plays it: a secret five-letter word, six guesses, G/Y/X feedback.

The rules, messages and rewards are TextArena 0.7.4's ``WordleEnv`` (``word_length=5``,
``num_guesses=6``): a guess is the first ``[word]`` in the action; a guess in the wrong format,
of the wrong length, already made, or not in the dictionary is an invalid move (the first one a
warning, a second in a row ends the game); a win ends the game with reward 1; the sixth guess
without a win ends it with the share of the last guess's letters that are green, plus half the
share that are yellow. The dictionary and the secrets are the lists in ``words``.
"""

from __future__ import annotations

import random
import re

from harness_grpo.envs.textarena.game import SinglePlayerGame
from harness_grpo.envs.wordle.words import ANSWERS, VALID_WORDS

WORD_LENGTH = 5
NUM_GUESSES = 6
GUESS = re.compile(r"\[(\w+)\]")


def player_prompt() -> str:
    return (
        f"You are Playing Wordle.\nA secret {WORD_LENGTH}-letter word has been chosen. "
        f"You have {NUM_GUESSES} attempts to guess it.\n"
        "For each guess, wrap your word in square brackets (e.g., '[apple]').\n"
        "Feedback for each letter will be given as follows:\n"
        "  - G (green): correct letter in the correct position\n"
        "  - Y (yellow): letter exists in the word but in the wrong position\n"
        "  - X (wrong): letter is not in the word\n"
        "Enter your guess to begin.\n"
    )


def score_guess(guess: str, secret: str) -> list[str]:
    """Per letter: ``G`` right place, ``Y`` in the word elsewhere (each secret letter used once), ``X`` absent."""
    feedback: list[str | None] = [None] * len(guess)
    remaining: list[str | None] = list(secret)
    for i, letter in enumerate(guess):
        if letter == remaining[i]:
            feedback[i] = "G"
            remaining[i] = None
    for i, letter in enumerate(guess):
        if feedback[i] is None:
            if letter in remaining:
                feedback[i] = "Y"
                remaining[remaining.index(letter)] = None
            else:
                feedback[i] = "X"
    return [mark or "X" for mark in feedback]


class WordleGame(SinglePlayerGame):
    """One Wordle game; see the module docstring."""

    def __init__(self, secret_word: str) -> None:
        super().__init__(
            player_prompt(),
            {"secret_word": secret_word, "guess_history": [], "word_length": WORD_LENGTH, "num_guesses": NUM_GUESSES},
        )

    @classmethod
    def new(cls, rng: random.Random, secret_word: str | None = None) -> WordleGame:
        """A game whose secret is ``secret_word`` (a valid word) or drawn from ``ANSWERS`` by ``rng``."""
        if secret_word is None:
            return cls(rng.choice(ANSWERS))
        word = secret_word.lower()
        if len(word) != WORD_LENGTH or word not in VALID_WORDS:
            raise ValueError(f"secret_word must be a {WORD_LENGTH}-letter word of the dictionary, got {secret_word!r}")
        return cls(word)

    def play(self, action: str) -> None:
        history = self.game_state["guess_history"]
        self.add_observation(action, player_action=True)
        match = GUESS.search(action)
        if match is None:
            reason = "You tried submitting a word in the wrong format. Please make sure to use squared brackets."
            self.set_invalid_move(reason, self.completion())
            return self.end_step()
        word = match.group(1).lower()
        if len(word) != WORD_LENGTH:
            self.set_invalid_move(f"Your word must be exactly {WORD_LENGTH} letters.", self.completion())
            return self.end_step()
        if word in (guessed for guessed, _ in history):
            reason = f"You have already guessed '{word}' before. Please try a different word."
            self.set_invalid_move(reason, self.completion())
            return self.end_step()
        if word not in VALID_WORDS:
            self.set_invalid_move(f"'{word}' is not an English word.", self.completion())
            return self.end_step()

        feedback = score_guess(word, self.game_state["secret_word"])
        history.append((word, feedback))
        self.game_state["rendered_board"] = self.render_board()
        self.game_state["player_view"] = self.player_view()
        if all(mark == "G" for mark in feedback):
            self.set_outcome(1, "Congratulations! You guessed the word correctly!")
        else:
            left = NUM_GUESSES - self.turn - 1
            self.add_observation(
                f"You submitted [{word}].\nFeedback:\n{self.player_view()}\nYou have {left} guesses left."
            )
        if len(history) >= NUM_GUESSES and not self.done:
            completion = self.completion()
            reason = (
                "The turn limit has been reached. You didn't guess the word, but your best guess matched "
                f"{round(completion * 100)}% of the letters in the correct positions.\n"
                f"The secret word was: **{self.game_state['secret_word']}**."
            )
            self.set_outcome(completion, reason)
        return self.end_step()

    def completion(self) -> float:
        """The last guess's greens plus half its yellows, over the word length (0.0 before any guess)."""
        history = self.game_state["guess_history"]
        if not history:
            return 0.0
        _, feedback = history[-1]
        return (feedback.count("G") + 0.5 * feedback.count("Y")) / WORD_LENGTH

    def render_board(self) -> str:
        rows = []
        for word, feedback in self.game_state["guess_history"]:
            letters = "| Letter  | " + " ".join(word.upper()) + " |"
            divider = "|---------|" + "--" * WORD_LENGTH + "--"
            status = "| Status  | " + " ".join(feedback) + " |"
            rows.append(f"{letters}\n{divider}\n{status}\n")
        return "\n".join(rows) if rows else "No guesses yet."

    def player_view(self) -> str:
        history = self.game_state["guess_history"]
        if not history:
            return "No guesses yet."
        word, feedback = history[-1]
        return f"{' '.join(word.upper())}\n{' '.join(feedback)}"
