"""Format SFT for the built-in tool loop: teach a small model an environment's tool calls, not its policy.

The usual SFT-then-RL recipe in miniature, for the tiny model that cannot read a tool schema it never
saw. ``random_episodes`` plays episodes through ``Environments`` (what the tool loop itself runs: the
row's ``reset``, the same tool messages) choosing every call at random: a tool uniformly among those
``moves`` names, its arguments from ``moves[name](rng)``. An episode ends when the environment is
``done`` or after ``max_turns`` calls, then the assistant closes with a short text answer. Trained on
those chats, the model calls the environment's tools with valid arguments, one call per turn, and
stops when the game is over; which move is good is left for GRPO to learn.

``tool_format_model(base, chats)`` is that SFT, cached under a digest of the base model, the recipe,
this module and the tokenized chats themselves, so any change to prompts, tools or environment
rebuilds it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness_grpo.environments import EnvironmentFactory, Environments, Message

Moves = Mapping[str, Callable[[random.Random], dict[str, Any]]]
"""Tool name -> a function drawing that tool's arguments at random."""
Policy = Callable[[list[Message], random.Random], dict[str, Any]]
"""The conversation so far (its last message the latest observation) -> the next call's ``{"name", "arguments"}``."""

TOOL_SFT_RECIPE = {"seed": 0, "steps": 300, "batch": 4, "lr": 3e-3, "threads": 2}
CLOSING = "Done."


def random_episodes(
    environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory],
    rows: Sequence[Mapping[str, Any]],
    moves: Moves,
    *,
    episodes: int,
    max_turns: int,
    seed: int = 0,
    policy: Policy | None = None,
) -> list[dict[str, Any]]:
    """``episodes`` chats (``{"messages", "tools"}``) of random moves on rows drawn from ``rows``.

    A rollout's tools that ``moves`` does not name are shown to the model but never called. ``policy``
    replaces the random choice (a probe's, e.g. ``bench.catch_moves --sft-board-moves``; a recipe's format
    SFT keeps it None, so that it teaches no move).
    """
    rng = random.Random(seed)
    environments = Environments(environment_factory)
    chats = []
    for _ in range(episodes):
        rollout = environments.start(rows[rng.randrange(len(rows))])
        try:
            names = sorted(name for name in rollout.toolbox.functions if name in moves)
            if not names:
                raise ValueError(f"moves names none of the tools {sorted(rollout.toolbox.functions)}")
            messages: list[Message] = [dict(m) for m in rollout.prompt]
            for turn in range(max_turns):
                if policy is None:
                    name = rng.choice(names)
                    function = {"name": name, "arguments": moves[name](rng)}
                else:
                    function = policy(messages, rng)
                call = {"id": f"call_{turn}", "type": "function", "function": function}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append(rollout.toolbox.call(call).message)
                if getattr(rollout.environment, "done", False):
                    break
            messages.append({"role": "assistant", "content": CLOSING})
            chats.append({"messages": messages, "tools": rollout.toolbox.schemas})
        finally:
            rollout.toolbox.close()
    return chats


def tool_format_model(base: Path, chats: Sequence[dict[str, Any]], recipe: Mapping[str, Any] = TOOL_SFT_RECIPE) -> Path:
    """The model at ``base`` after ``train_tool_format`` on ``chats``, built once per digest (module docstring)."""
    from transformers import AutoTokenizer

    from harness_grpo.tiny_model.build import cached_build
    from harness_grpo.tiny_model.warm_start import tokenize_chat

    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = [tokenize_chat(tokenizer, chat) for chat in chats]
    digest = hashlib.sha256(f"{base.resolve()}\n{json.dumps(dict(recipe), sort_keys=True)}\n".encode())
    digest.update(inspect.getsource(train_tool_format).encode())
    digest.update(json.dumps(rows).encode())
    name = f"tool-sft-{digest.hexdigest()[:16]}"
    return cached_build(name, lambda dest: train_tool_format(base, dest, rows, recipe))


def train_tool_format(
    base: Path, dest: Path, rows: Sequence[tuple[list[int], list[int]]], recipe: Mapping[str, Any]
) -> dict[str, Any]:
    """SFT ``base`` on token rows (ids, assistant mask) per ``recipe``; save model, tokenizer and stats to ``dest``.

    A step is ``batch`` rows that share their system block (prompt, tools), drawn from one such group; the
    block runs once per step, without gradient (``warm_start.group_loss``), and only assistant tokens are
    predicted.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness_grpo.tiny_model.warm_start import group_loss

    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    rng = random.Random(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(base)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    groups: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    for ids, mask in rows:
        split = ids.index(start, 1)
        groups.setdefault(tuple(ids[:split]), []).append((ids[split:], [float(m) for m in mask[split:]]))
    prefixes = sorted(groups)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
    model.train()
    started, losses = time.perf_counter(), []
    for _ in range(recipe["steps"]):
        prefix = rng.choice(prefixes)
        batch = [rng.choice(groups[prefix]) for _ in range(recipe["batch"])]
        loss = group_loss(model, list(prefix), batch, tokenizer.pad_token_id, prefix_grad=False)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
    model.eval()
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    for path in base.iterdir():
        if path.name.startswith("tokenizer") or path.name.endswith(".jinja") or path.name == "special_tokens_map.json":
            shutil.copyfile(path, dest / path.name)
    stats = {
        "recipe": dict(recipe),
        "base": str(base),
        "chats": len(rows),
        "train_wall_s": round(time.perf_counter() - started, 1),
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
    (dest / "tool_sft.json").write_text(json.dumps(stats, indent=1))
    return stats
