"""``grpo_wordle``'s per-turn reward terms on a game written out as the tool loop records it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from examples.grpo_wordle.grpo_wordle import GUESSES, Guess, reward_letters, reward_mistakes


def _call(*words: str) -> dict[str, Any]:
    calls = [{"function": {"name": "guess", "arguments": {"word": word}}} for word in words]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _reply(content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content}


def _game(guesses: list[Guess], done: bool) -> SimpleNamespace:
    return SimpleNamespace(guesses=guesses, done=done)


CRANE = Guess("crane", "C R A N E\nX Y X X G", 0.3, False)
SLATE = Guess("slate", "S L A T E\nX X X X G", 0.2, False)
CRANE_AGAIN = Guess("crane", "C R A N E\nX Y X X G (again)", 0.0, True)
BRINE = Guess("brine", "B R I N E\nG G X X G", 0.6, False)
REFUSED = "{'error': 'guess() missing 1 required positional argument'}"


def test_each_turn_gets_what_its_guesses_added_to_the_best_and_its_own_mistakes() -> None:
    completion = [
        _call("crane"),
        _reply(CRANE.feedback),
        _call(),  # a refused call: no guess, no score
        _reply(REFUSED),
        _call("slate", "crane"),  # two guesses in one turn: a worse word and a repeat
        _reply(SLATE.feedback),
        _reply(CRANE_AGAIN.feedback),
        _call("brine"),
        _reply(BRINE.feedback),
        {"role": "assistant", "content": "I give up."},  # stopped with two guesses left
    ]
    game = _game([CRANE, SLATE, CRANE_AGAIN, BRINE], done=False)
    (letters,) = reward_letters(completions=[completion], environments=[game])
    assert letters == pytest.approx([0.3, None, 0.0, 0.3, None])
    assert sum(v for v in letters if v is not None) == pytest.approx(0.6)  # the game's best guess
    (mistakes,) = reward_mistakes(completions=[completion], environments=[game])
    assert mistakes == pytest.approx([0.0, None, -0.2, 0.0, -0.2 * (GUESSES - 4)])


def test_a_game_given_up_is_worse_than_a_game_played_to_its_end() -> None:
    nothing = [{"role": "assistant", "content": "No."}]
    (given_up,) = reward_mistakes(completions=[nothing], environments=[_game([], done=False)])
    assert given_up == pytest.approx([-0.2 * GUESSES])
    played = [_call("crane"), _reply(CRANE.feedback), {"role": "assistant", "content": "Won?"}]
    (over,) = reward_mistakes(completions=[played], environments=[_game([CRANE], done=True)])
    assert over == pytest.approx([0.0, None])  # the game was over: stopping costs nothing
