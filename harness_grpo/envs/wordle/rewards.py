"""Wordle's per-step reward signals, as OpenEnv's ``textarena_env.rewards`` computes them.

Every step's observation carries ``info["reward_signals"]`` (and the same in ``metadata``):
``wordle.greens`` and ``wordle.yellows`` (the latest feedback row's counts over 5),
``wordle.repetitions`` (1 minus how often this guess was made before) and ``wordle.correct``
(the step's reward). The helpers read guesses and feedback out of actions and transcripts.
"""

from __future__ import annotations

import re

from harness_grpo.envs.textarena.models import TextArenaAction, TextArenaObservation

_GUESS = re.compile(r"\[[A-Za-z]{5}\]")


def extract_guess(text: str) -> str:
    """The first ``[abcde]`` in ``text``, lowercased; else its first five letters bracketed; else ``[dunno]``."""
    match = _GUESS.search(text)
    if match:
        return match.group(0).lower()
    cleaned = re.sub(r"[^a-z]", "", text.lower())
    return f"[{cleaned[:5]}]" if len(cleaned) >= 5 else "[dunno]"


def extract_wordle_feedback(observation: TextArenaObservation) -> str:
    """The text after the first ``Feedback:`` of the latest message that has one ("" if none)."""
    for message in reversed(observation.messages):
        content = message.content.strip()
        if "Feedback:" in content:
            return content.split("Feedback:", 1)[-1].strip()
    return ""


def extract_feedback_counts(feedback: str) -> tuple[int, int]:
    """Greens and yellows of the last all-G/Y/X line of ``feedback``."""
    lines = [line.strip() for line in feedback.split("\n") if line.strip()]
    if len(lines) < 2:
        return (0, 0)
    for line in reversed(lines):
        marks = line.replace(" ", "")
        if marks and all(mark in "GYX" for mark in marks):
            return (marks.count("G"), marks.count("Y"))
    return (0, 0)


class WordleRewardProvider:
    """The ``wordle.*`` signals of one episode (it remembers the guesses made)."""

    def __init__(self) -> None:
        self._guess_counts: dict[str, int] = {}

    def reset(self) -> None:
        self._guess_counts.clear()

    def compute(self, *, action: TextArenaAction, observation: TextArenaObservation) -> dict[str, float]:
        guess = extract_guess(action.message)
        normalized = guess if guess != "[dunno]" else ""
        previous = self._guess_counts.get(normalized, 0) if normalized else 0
        greens, yellows = extract_feedback_counts(extract_wordle_feedback(observation))
        if normalized:
            self._guess_counts[normalized] = previous + 1
        return {
            "wordle.greens": greens / 5.0,
            "wordle.yellows": yellows / 5.0,
            "wordle.repetitions": 1.0 - previous,
            "wordle.correct": float(observation.reward or 0.0),
        }
