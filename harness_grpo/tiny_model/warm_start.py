"""Warm start of the tiny model: a short, seeded SFT on synthetic tool-use chats.

Contract: ``warm_tiny_model_path()`` returns a cached checkpoint (same tokenizer
files as the base model) trained by ``WARM_RECIPE`` from ``tiny_model_path()``
so that it answers a request with ``<tool_call>{json}</tool_call>`` naming one
of the request's tools. The cache directory is named by a digest of the base
model's digest, ``WARM_RECIPE``, ``synthetic.py`` and the training code, so
changing any of them rebuilds. Training takes about 11 minutes on 2 CPU cores and
writes ``warm_start.json`` (recipe, digests, wall time, losses) next to the
weights. ``evaluate_tool_calls`` samples a model on prompts and reports how
often its output holds a well-formed call to a listed tool.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from harness_grpo.tiny_model import synthetic
from harness_grpo.tiny_model.build import cached_build, recipe_digest, tiny_model_path

WARM_RECIPE = {
    "seed": 1234,
    "data_seed": 1,
    "steps": 600,
    "group_size": 4,
    "long_group_size": 6,
    "long_prefix_tokens": 2500,
    "lr": 3e-3,
    "min_lr_ratio": 0.1,
    "warmup_steps": 20,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "no_think_fraction": 0.15,
    "name_weight": 5.0,
    "threads": 2,
}
LOG = logging.getLogger(__name__)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def tokenize_chat(
    tokenizer: PreTrainedTokenizerBase, chat: dict[str, Any], no_think_at: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and assistant mask (1 on assistant content, tool calls and their ``<|im_end|>``).

    With ``no_think_at`` (the index of an assistant message), the chat is cut after that
    message, which follows an ``enable_thinking=False`` generation prompt.
    """
    messages, tools = chat["messages"], chat["tools"]
    if no_think_at is None:
        out = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return list(out["input_ids"]), list(out["assistant_masks"])
    head = messages[:no_think_at]
    out = tokenizer.apply_chat_template(
        head,
        tools=tools,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    plain_prompt = tokenizer.apply_chat_template(head, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages[: no_think_at + 1], tools=tools, tokenize=False)
    completion = full[len(plain_prompt) :]
    assert completion.endswith("<|im_end|>\n"), completion
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = list(out["input_ids"]) + list(completion_ids)
    mask = list(out["assistant_masks"]) + [1] * (len(completion_ids) - 1) + [0]
    return ids, mask


def name_weights(tokenizer: PreTrainedTokenizerBase, ids: list[int], mask: list[int], weight: float) -> list[float]:
    """``mask`` as floats, with ``weight`` on the tokens of each tool-call name (and the ``",`` that closes it)."""
    opening = tokenizer('<tool_call>\n{"name": "', add_special_tokens=False)["input_ids"]
    closing = tokenizer('",', add_special_tokens=False)["input_ids"]
    weights = [float(m) for m in mask]
    i = 0
    while i < len(ids):
        if ids[i : i + len(opening)] == opening and mask[i]:
            j = i + len(opening)
            while j < len(ids) and mask[j] and ids[j : j + len(closing)] != closing:
                weights[j] = weight
                j += 1
            weights[j : j + len(closing)] = [weight] * len(closing)
            i = j
        i += 1
    return weights


def _group(
    tokenizer: PreTrainedTokenizerBase, chats: list[dict[str, Any]], rng: random.Random, recipe: dict[str, Any]
) -> tuple[list[int], list[tuple[list[int], list[float]]]]:
    """Tokenize chats that share their system block: (shared prefix ids, per chat (suffix ids, suffix weights)).

    Uses all the chats when the prefix is long (``long_prefix_tokens``), else the first ``group_size``:
    a long prefix costs most of a step, so it is amortised over more rows.
    """
    first_ids, _ = tokenize_chat(tokenizer, chats[0])
    split = first_ids.index(tokenizer.convert_tokens_to_ids("<|im_start|>"), 1)
    if split < recipe["long_prefix_tokens"]:
        chats = chats[: recipe["group_size"]]
    rows = []
    for chat in chats:
        cut = None
        if rng.random() < recipe["no_think_fraction"]:
            cut = rng.choice([i for i, m in enumerate(chat["messages"]) if m["role"] == "assistant"])
        ids, mask = tokenize_chat(tokenizer, chat, cut)
        rows.append((ids, name_weights(tokenizer, ids, mask, recipe["name_weight"])))
    prefix = first_ids[:split]
    assert all(ids[:split] == prefix and not any(w[:split]) for ids, w in rows)
    return prefix, [(ids[split:], w[split:]) for ids, w in rows]


def _collate(rows: list[tuple[list[int], list[float]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(rows), width))
    for row, (x, w) in enumerate(rows):
        ids[row, : len(x)] = torch.tensor(x)
        weights[row, : len(w)] = torch.tensor(w, dtype=torch.float)
    return ids, weights


def group_loss(
    model: torch.nn.Module,
    prefix: list[int],
    rows: list[tuple[list[int], list[float]]],
    pad_id: int,
    prefix_grad: bool = True,
) -> torch.Tensor:
    """Weighted mean next-token loss over the tokens of ``prefix + row`` (every row) with weight > 0.

    Weights are 0 off assistant tokens (see ``name_weights``). The shared prefix runs once and its KV
    cache is repeated per row, so the loss equals that of the full sequences at a fraction of the cost
    (and so does the gradient, unless ``prefix_grad`` is False: then no gradient flows through the
    prefix's keys and values, which makes long prefixes several times cheaper). Rows are right-padded
    and need no attention mask: causal rows never attend to the pads after them. Logits are computed
    only at positions that predict a weighted token.
    """
    ids, weights = _collate(rows, pad_id)
    with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
        cache = model.model(input_ids=torch.tensor([prefix]), use_cache=True).cache
    cache.batch_repeat_interleave(len(rows))
    hidden = model.model(input_ids=ids, cache=cache).last_hidden_state
    target = weights[:, 1:] > 0
    logits = model.lm_head(hidden[:, :-1][target])
    losses = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][target], reduction="none")
    w = weights[:, 1:][target]
    return (losses * w).sum() / w.sum()


def train_warm_model(base: Path, dest: Path, recipe: dict[str, Any] = WARM_RECIPE) -> dict[str, Any]:
    """SFT the model at ``base`` on synthetic chats per ``recipe``; save it to ``dest``; return stats.

    One step is one group of chats sharing a system prompt and tool list (see ``_group``); groups
    cycle through the agent families (see ``synthetic.synthetic_chats``). Long prefixes (real agents
    send 8-16k tokens of instructions and tool schemas) train without gradient through the prefix.
    """
    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    rng = random.Random(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    start = time.perf_counter()
    size = recipe["long_group_size"]
    chats = synthetic.synthetic_chats(recipe["steps"] * size, recipe["data_seed"], group_size=size)
    groups = [_group(tokenizer, chats[i : i + size], rng, recipe) for i in range(0, len(chats), size)]
    data_s = time.perf_counter() - start
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe["lr"],
        betas=(0.9, 0.95),
    )
    steps, warmup, floor = len(groups), recipe["warmup_steps"], recipe["min_lr_ratio"]

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(progress * math.pi))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    losses, tokens, supervised = [], 0, 0
    for prefix, rows in groups:
        long = len(prefix) >= recipe["long_prefix_tokens"]
        loss = group_loss(model, prefix, rows, tokenizer.pad_token_id, prefix_grad=not long)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        if len(losses) % 50 == 0:
            LOG.info(
                "warm start step %d/%d loss %.3f (%.0fs)", len(losses), steps, loss.item(), time.perf_counter() - start
            )
        tokens += len(prefix) + sum(len(ids) for ids, _ in rows)
        supervised += sum(sum(w > 0 for w in weights) for _, weights in rows)
    model.eval()
    wall_s = time.perf_counter() - start
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    for name in TOKENIZER_FILES:
        shutil.copyfile(base / name, dest / name)
    stats = {
        "recipe": recipe,
        "digest": warm_digest(recipe),
        "base_digest": recipe_digest(),
        "train_wall_s": round(wall_s, 1),
        "data_s": round(data_s, 1),
        "steps": steps,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "loss_first": losses[0],
        "loss_last10": round(statistics.mean(losses[-10:]), 4),
        "losses": losses,
    }
    (dest / "warm_start.json").write_text(json.dumps(stats, indent=1))
    return stats


def warm_digest(recipe: dict[str, Any] = WARM_RECIPE) -> str:
    """Digest of the base digest, the recipe, ``synthetic.py`` and the training code."""
    h = hashlib.sha256(recipe_digest().encode())
    h.update(json.dumps(recipe, sort_keys=True).encode())
    h.update(Path(synthetic.__file__).read_bytes())
    for fn in (tokenize_chat, name_weights, _group, _collate, group_loss, train_warm_model):
        h.update(inspect.getsource(fn).encode())
    return h.hexdigest()[:16]


def warm_tiny_model_path() -> Path:
    """Path to the warm-started tiny model, training it on first use (minutes)."""
    base = tiny_model_path()
    return cached_build(f"tiny-qwen3-warm-{warm_digest()}", lambda dest: train_warm_model(base, dest))


def _judge(text: str, tool_names: set[str]) -> dict[str, bool]:
    # Imported here: harness_grpo.engine imports this module for warm_tiny_model_path.
    from harness_grpo.engine.tool_parser import parse_tool_calls

    _, calls = parse_tool_calls(text)
    names_ok = bool(calls) and all(c["function"]["name"] in tool_names for c in calls)
    args_ok = bool(calls)
    for call in calls:
        try:
            args_ok = args_ok and isinstance(json.loads(call["function"]["arguments"]), dict)
        except json.JSONDecodeError:
            args_ok = False
    return {"parsable": bool(calls), "valid_name": names_ok, "args_object": args_ok, "valid_call": names_ok and args_ok}


@torch.no_grad()
def evaluate_tool_calls(
    model_path: Path,
    prompts: list[dict[str, Any]],
    temperature: float,
    seed: int = 0,
    max_new_tokens: int = 192,
    batch_tokens: int = 16384,
) -> dict[str, Any]:
    """Sample one completion per prompt (full vocabulary) and report tool-call rates.

    Rates are fractions of outputs: ``parsable`` (``parse_tool_calls`` finds a call),
    ``valid_name`` (parsable and every name is in the prompt's tools), ``args_object``
    (parsable and every ``arguments`` is a JSON object), ``valid_call`` (both);
    ``mean_new_tokens`` is the mean output length. ``samples`` holds a few outputs.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    texts = [
        tokenizer.apply_chat_template(p["messages"], tools=p["tools"], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    outputs: dict[int, tuple[str, int]] = {}
    torch.manual_seed(seed)
    while order:  # shortest first; a batch is as wide as its longest prompt, within batch_tokens
        take = 1
        while take < len(order) and (take + 1) * (len(encoded[order[take]]) + max_new_tokens) <= batch_tokens:
            take += 1
        chunk, order = order[:take], order[take:]
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt")
        generated = model.generate(
            **batch,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
        )
        new = generated[:, batch["input_ids"].shape[1] :]
        for i, row in zip(chunk, new, strict=True):
            kept = row[row != tokenizer.pad_token_id]
            eos = (kept == tokenizer.convert_tokens_to_ids("<|im_end|>")).nonzero()
            n = int(eos[0, 0]) + 1 if len(eos) else len(kept)
            outputs[i] = (tokenizer.decode(kept[:n], skip_special_tokens=True), n)
    judged = [_judge(outputs[i][0], {t["function"]["name"] for t in p["tools"]}) for i, p in enumerate(prompts)]
    report: dict[str, Any] = {"n": len(prompts), "temperature": temperature}
    for key in ("parsable", "valid_name", "args_object", "valid_call"):
        report[key] = sum(j[key] for j in judged) / len(judged)
    report["mean_new_tokens"] = statistics.mean(outputs[i][1] for i in range(len(prompts)))
    report["samples"] = [outputs[i][0] for i in range(min(3, len(prompts)))]
    return report
