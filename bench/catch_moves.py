"""Does a Catch policy look at the board? Its moves by what the board said.

    python examples/grpo_catch/grpo_catch.py --output_dir runs/catch --save_rollouts true
    python -m bench.catch_moves runs/catch/rollouts.jsonl --window 5
    python -m bench.catch_moves --model ~/.cache/harness_grpo/tool-sft-...   # a checkpoint, before any game
    python -m bench.catch_moves --sft-board-moves [--steps 300 --lr 3e-3]    # can the tiny model read the board?

With a ``rollouts.jsonl`` (a ``grpo_catch`` run with ``save_rollouts``) it prints, per window of steps, the
games caught and, for each relation the last board stated (the ball to the LEFT of the paddle, to its RIGHT,
or directly ABOVE it), the share of the model's next moves that were ``left``, ``stay`` and ``right``. A
policy that learns Catch moves towards the ball and stays under it; a policy whose three rows are alike
ignores the board, whatever its shaping reward says. With ``--model`` it prints, for each column of the
ball on the opening board, the model's probability of calling ``stay`` and of ``left`` over ``left`` +
``right`` for a ``move``, read off its next-token distribution at the recipe's first prompt.

``--sft-board-moves`` is a capacity probe, not a recipe: the warm tiny model after the recipe's format SFT
(same episodes count, turns, steps and optimizer) on moves that follow the board (move towards the ball,
stay under it) instead of random ones, then its first-move odds as with ``--model``. If it reads the board
after that, the model can represent the mapping and what GRPO lacks is signal, not capacity.
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
NAME = '<tool_call>\n{"name": "'  # the call as the tool loop's template writes it, up to the tool's name
DIRECTION = NAME + 'move", "arguments": {"direction": "'


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


def first_move_odds(model_path: str) -> None:
    """Per ball column on the opening board: P(stay) and P(left | move) of the model's first call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.grpo_catch.grpo_catch import dataset
    from harness_grpo.environments import tool_schema
    from harness_grpo.envs.catch.server import COLUMNS, ROWS
    from harness_grpo.envs.catch.tools import CatchToolEnv, describe

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tools = [tool_schema(CatchToolEnv.move, "move"), tool_schema(CatchToolEnv.stay, "stay")]

    def next_token(prompt: str, call: str, choices: tuple[str, str]) -> tuple[float, float]:
        ids = tokenizer(prompt + call, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            probs = model(ids).logits[0, -1].softmax(-1)
        first = [tokenizer(choice, add_special_tokens=False).input_ids[0] for choice in choices]
        return float(probs[first[0]]), float(probs[first[1]])

    for ball in range(COLUMNS):
        board = [0.0] * (ROWS * COLUMNS)
        board[ball] = board[(ROWS - 1) * COLUMNS + COLUMNS // 2] = 1.0
        messages = [dict(message) for message in dataset(1)[0]["prompt"]]
        messages[-1]["content"] += describe(board, ball)
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        move, stay = next_token(prompt, NAME, ("move", "stay"))
        left, right = next_token(prompt, DIRECTION, ("left", "right"))
        odds = f"P(stay) {stay / (move + stay):.3f}  P(left | move) {left / (left + right):.3f}"
        print(f"ball column {ball + 1}/{COLUMNS}: {odds}")


def board_move(messages: list[dict[str, Any]], rng: Any) -> dict[str, Any]:
    """The move the last board asks for: towards the ball, or ``stay`` under it."""
    found = RELATION.search(messages[-1].get("content") or "")
    side = found.group(1) if found else None
    return {"name": "move", "arguments": {"direction": side.lower()}} if side else {"name": "stay", "arguments": {}}


def board_move_model(steps: int, lr: float) -> str:
    """The warm tiny model after ``grpo_catch``'s format SFT with ``board_move`` for its moves (cached)."""
    from examples.grpo_catch.grpo_catch import RECIPE
    from examples.recipe import RecipeArguments, environment_servers
    from harness_grpo.config import HarnessGRPOConfig
    from harness_grpo.tiny_model.tool_sft import TOOL_SFT_RECIPE, random_episodes, tool_format_model
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    with environment_servers(RECIPE, [], capacity=1):
        chats = random_episodes(
            RECIPE.environment_factory,
            RECIPE.dataset(64),
            RECIPE.moves,
            episodes=RecipeArguments.__dataclass_fields__["sft_episodes"].default,
            max_turns=RECIPE.sft_turns,
            seed=HarnessGRPOConfig.__dataclass_fields__["seed"].default,
            policy=board_move,
        )
    return str(tool_format_model(warm_tiny_model_path(), chats, {**TOOL_SFT_RECIPE, "steps": steps, "lr": lr}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rollouts", type=Path, nargs="?")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--model", help="A checkpoint to read the first move's odds from, instead of a run.")
    parser.add_argument("--sft-board-moves", action="store_true", help="the capacity probe (module docstring)")
    parser.add_argument("--steps", type=int, default=300, help="SFT steps of --sft-board-moves")
    parser.add_argument("--lr", type=float, default=3e-3, help="SFT learning rate of --sft-board-moves")
    args = parser.parse_args()
    if args.sft_board_moves:
        args.model = board_move_model(args.steps, args.lr)
        print(f"SFT on board-following moves: {args.model}")
    if args.model:
        first_move_odds(args.model)
        return
    if args.rollouts is None:
        parser.error("give a rollouts.jsonl or --model")
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
