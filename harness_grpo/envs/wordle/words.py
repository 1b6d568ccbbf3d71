"""Wordle's word lists, shipped with the package (see ``data/NOTICE`` for where they come from).

``VALID_WORDS`` are the guesses the game accepts; ``ANSWERS`` the secrets it draws (all valid).
"""

from __future__ import annotations

from importlib.resources import files


def _load(name: str) -> tuple[str, ...]:
    text = files("harness_grpo.envs.wordle").joinpath("data", name).read_text()
    return tuple(line.strip() for line in text.splitlines() if line.strip())


VALID_WORDS: frozenset[str] = frozenset(_load("words.txt"))
ANSWERS: tuple[str, ...] = _load("answers.txt")
