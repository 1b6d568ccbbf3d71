"""``python -m harness_grpo.tiny_model [--warm] [--eval]``: build (cached) and print the model path.

With ``--eval``, also sample the model on held-out synthetic prompts and print the
tool-call report (see ``warm_start.evaluate_tool_calls``) as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging

from harness_grpo.tiny_model.build import tiny_model_path
from harness_grpo.tiny_model.synthetic import heldout_prompts
from harness_grpo.tiny_model.warm_start import evaluate_tool_calls, warm_tiny_model_path


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv``, build the requested model, print its path and optionally the eval report."""
    parser = argparse.ArgumentParser(prog="python -m harness_grpo.tiny_model", description=__doc__)
    parser.add_argument("--warm", action="store_true", help="the warm-started model (trains on first use)")
    parser.add_argument("--eval", action="store_true", help="print the tool-call parse report")
    parser.add_argument("--n", type=int, default=32, help="held-out prompts (plus n/4 with long system prompts)")
    parser.add_argument("--seed", type=int, default=10_000, help="held-out prompt seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = warm_tiny_model_path() if args.warm else tiny_model_path()
    print(path)
    if args.eval:
        sets = {
            "short": heldout_prompts(args.n, args.seed),
            "long_system": heldout_prompts(max(1, args.n // 4), args.seed + 1, system_chars=20_000),
        }
        for name, prompts in sets.items():
            for temperature in (0.7, 1.0):
                report = evaluate_tool_calls(path, prompts, temperature, seed=args.seed)
                print(json.dumps({"prompts": name, **report}))


if __name__ == "__main__":
    main()
