"""Does a Catch policy look at the board? Its moves by what the board said, per window of training steps.

    python examples/grpo_catch/grpo_catch.py --output_dir runs/catch --save_rollouts true
    python -m bench.catch_moves runs/catch/rollouts.jsonl --window 5

Reads the ``rollouts.jsonl`` a ``grpo_catch`` run writes with ``save_rollouts`` and prints, per window of
steps, the games caught and, for each relation the last board stated (the ball to the LEFT of the paddle, to
its RIGHT, or directly ABOVE it), the share of the model's next moves that were ``left``, ``stay`` and
``right``. A policy that learns Catch moves towards the ball and stays under it; a policy whose three rows
are alike ignores the board, whatever its shaping reward says.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson

RELATION = re.compile(r"to the (LEFT|RIGHT) of the paddle|(directly above) the paddle")
RELATIONS = ("LEFT", "RIGHT", "ABOVE")


def conversation(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """A game's whole conversation: the last turn's request and the reply it got."""
    last = trace["turns"][-1]
    return [*last["request"]["messages"], last["response"]["choices"][0]["message"]]


def moves_by_relation(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(relation the last board stated, move made next)`` for every tool call of a game."""
    pairs, relation = [], None
    for message in messages:
        if message["role"] in ("user", "tool"):
            found = RELATION.search(message.get("content") or "")
            relation = (found.group(1) or "ABOVE") if found else None
        elif message["role"] == "assistant" and relation:
            for call in message.get("tool_calls") or []:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                move = "stay" if name == "stay" else "left" if "left" in arguments else "right"
                pairs.append((relation, move))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rollouts", type=Path)
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    moves: dict[int, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    caught: dict[int, list[bool]] = defaultdict(list)
    for line in args.rollouts.read_bytes().splitlines():
        rollout = orjson.loads(line)
        if not rollout["trace"]:
            continue
        window = (rollout["step"] - 1) // args.window
        messages = conversation(rollout["trace"])
        caught[window].append(any("Caught it" in (m.get("content") or "") for m in messages if m["role"] == "tool"))
        for relation, move in moves_by_relation(messages):
            moves[window][relation][move] += 1
    for window in sorted(moves):
        first = window * args.window + 1
        games = caught[window]
        cells = [f"steps {first}-{first + args.window - 1}: caught {sum(games)}/{len(games)}"]
        for relation in RELATIONS:
            counts = moves[window][relation]
            total = sum(counts.values()) or 1
            shares = " ".join(f"{move[0].upper()} {counts[move] / total:.2f}" for move in ("left", "stay", "right"))
            cells.append(f"{relation}: {shares} (n={sum(counts.values())})")
        print("  ".join(cells))


if __name__ == "__main__":
    main()
