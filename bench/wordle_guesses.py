"""What does a Wordle policy learn? Its guesses, window by window of training steps.

    python examples/grpo_wordle/grpo_wordle.py --output_dir runs/wordle --save_rollouts true
    python -m bench.wordle_guesses runs/wordle/rollouts.jsonl --window 20

Reads a ``grpo_wordle`` run's ``rollouts.jsonl`` and prints, per window of steps: games and wins, guesses
per game and games stopped before they were over, the share of guesses that were repeated or invalid, the
letter credit (greens plus half the yellows, over five letters) of the first guess and of the game's best,
how many distinct words opened a game, and the most frequent openers. A policy that plays better without
reading the feedback makes more distinct guesses of words with common letters; one that reads it also
raises its later guesses' credit over its first.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson

from harness_grpo.envs.wordle.rewards import extract_feedback_counts

GUESSES = 6


WON = 0.95
"""A rollout's total reward at or above this is a win: a win earns at least 1 (``reward_win``) + 1 (its best guess's
letters) - 0.2 x 5 mistakes, a game not won at most 0.9 (four greens and a yellow). The winning feedback itself is
not in the trace: the tool loop stops at the game's end without calling the model again."""


def game(record: dict[str, Any]) -> dict[str, Any]:
    """A game's guesses (word, letter credit or None for a refused guess), whether it was won or over."""
    last = record["trace"]["turns"][-1]
    messages = [*last["request"]["messages"], last["response"]["choices"][0]["message"]]
    words = [
        orjson.loads(call["function"]["arguments"]).get("word", "")
        if isinstance(call["function"]["arguments"], str)
        else call["function"]["arguments"].get("word", "")
        for message in messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]
    replies = [message.get("content") or "" for message in messages if message["role"] == "tool"]
    guesses = []
    for word, reply in zip(words, replies, strict=False):
        if "Feedback:" in reply:
            greens, yellows = extract_feedback_counts(reply.split("Feedback:", 1)[1])
            guesses.append((str(word).strip().lower(), (greens + 0.5 * yellows) / 5))
        else:
            guesses.append((str(word).strip().lower(), None))
    won = (record["reward"] or 0.0) >= WON
    return {
        "guesses": guesses,
        "won": won,
        "over": won or "The game is over" in "\n".join(replies) or len(guesses) >= GUESSES,
    }


def summarise(games: list[dict[str, Any]]) -> str:
    guesses = [g for played in games for g in played["guesses"]]
    seen_twice = sum(
        1 for played in games for i, (word, _) in enumerate(played["guesses"]) if word in dict(played["guesses"][:i])
    )
    refused = sum(1 for _, credit in guesses if credit is None)
    firsts = [played["guesses"][0] for played in games if played["guesses"]]
    first_credit = [credit or 0.0 for _, credit in firsts]
    best = [max((credit or 0.0 for _, credit in played["guesses"]), default=0.0) for played in games]
    openers = Counter(word for word, _ in firsts)
    top = ", ".join(f"{word} {count}" for word, count in openers.most_common(4))
    return (
        f"games {len(games)}  won {sum(p['won'] for p in games)}  "
        f"guesses/game {len(guesses) / len(games):.2f}  stopped early {sum(not p['over'] for p in games)}  "
        f"repeated {seen_twice / max(len(guesses), 1):.2f}  invalid {refused / max(len(guesses), 1):.2f}  "
        f"credit first {statistics.mean(first_credit or [0.0]):.3f} best {statistics.mean(best):.3f}  "
        f"openers {len(openers)} distinct: {top}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rollouts", type=Path)
    parser.add_argument("--window", type=int, default=10)
    args = parser.parse_args()
    windows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in args.rollouts.read_bytes().splitlines():
        record = orjson.loads(line)
        if record["trace"] is not None and record["trace"]["turns"]:
            windows[(record["step"] - 1) // args.window].append(game(record))
    for index in sorted(windows):
        start = index * args.window + 1
        print(f"steps {start}-{start + args.window - 1}: {summarise(windows[index])}")


if __name__ == "__main__":
    main()
