"""Bench: tool-call rates of the base vs the warm-started tiny model.

Usage: ``.venv/bin/python bench/warm_start_tool_calls.py [--n 48] [--n-long 8] [--json out.json]``

Builds both models (cached; the warm start trains on first use), samples each at
T=0.7 and T=1.0 with the full vocabulary on held-out synthetic prompts (a seed the
warm start never saw; tool lists partly shuffled) and on prompts whose system prompt
is ~20k characters (~6k tokens), and prints, per model, prompt set and temperature:
% outputs with a parsable tool call, % whose names are all in the request's tools,
% whose arguments are JSON objects, % both, mean output tokens; then the warm start's
training wall time. Target: warm ``valid_call`` >= 80% at T=0.7 on the short set.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from harness_grpo.tiny_model import tiny_model_path, warm_tiny_model_path
from harness_grpo.tiny_model.synthetic import heldout_prompts
from harness_grpo.tiny_model.warm_start import evaluate_tool_calls


def main() -> None:
    """Run the bench and print the table (and write JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=48, help="short held-out prompts")
    parser.add_argument("--n-long", type=int, default=8, help="prompts with a long system prompt")
    parser.add_argument("--long-chars", type=int, default=20_000, help="system prompt length of the long set")
    parser.add_argument("--seed", type=int, default=20_000, help="held-out prompt and sampling seed")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--json", type=Path, help="write the full results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    models = {"base": tiny_model_path(), "warm": warm_tiny_model_path()}
    warm_stats = json.loads((models["warm"] / "warm_start.json").read_text())
    sets = {
        "short": heldout_prompts(args.n, args.seed),
        "long_system": heldout_prompts(args.n_long, args.seed + 1, system_chars=args.long_chars),
    }
    rows = []
    for set_name, prompts in sets.items():
        for temperature in (0.7, 1.0):
            for model_name, path in models.items():
                start = time.perf_counter()
                report = evaluate_tool_calls(path, prompts, temperature, args.seed, args.max_new_tokens)
                report.update(model=model_name, prompts=set_name, eval_s=round(time.perf_counter() - start, 1))
                rows.append(report)

    header = (
        f"{'prompts':<12} {'T':>4} {'model':<5} {'parsable':>9} {'name_ok':>8} {'args_obj':>9} {'valid':>6} {'len':>6}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['prompts']:<12} {r['temperature']:>4} {r['model']:<5} {r['parsable']:>9.0%} {r['valid_name']:>8.0%}"
            f" {r['args_object']:>9.0%} {r['valid_call']:>6.0%} {r['mean_new_tokens']:>6.1f}"
        )
    print(
        f"warm start: {warm_stats['train_wall_s']} s wall, {warm_stats['steps']} steps, "
        f"{warm_stats['tokens']} tokens ({warm_stats['supervised_tokens']} supervised), "
        f"loss {warm_stats['loss_first']} -> {warm_stats['loss_last10']}"
    )
    if args.json:
        summary = {k: v for k, v in warm_stats.items() if k != "losses"}
        args.json.write_text(json.dumps({"warm_start": summary, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
