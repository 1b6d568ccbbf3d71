"""``python -m harness_grpo.tiny_model [--warm] [--shell-chores] [--eval]``: build (cached) and print the model path.

With ``--shell-chores``, also build each CLI's shell-chore SFT model on the easy tasks of ``examples/tasks``
(``shell_sft.SHELL_CHORE_AGENTS``: what ``launchers/train.py --harness CLI --difficulty easy`` and the tests
serve) and print their paths, so no training run or timed test pays for an SFT. With ``--eval``, also sample
the model on held-out synthetic prompts and print the tool-call report (see ``warm_start.evaluate_tool_calls``)
as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from harness_grpo.tiny_model.build import tiny_model_path
from harness_grpo.tiny_model.synthetic import heldout_prompts
from harness_grpo.tiny_model.warm_start import evaluate_tool_calls, warm_tiny_model_path

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv``, build the requested model, print its path and optionally the eval report."""
    parser = argparse.ArgumentParser(prog="python -m harness_grpo.tiny_model", description=__doc__)
    parser.add_argument("--warm", action="store_true", help="the warm-started model (trains on first use)")
    parser.add_argument("--shell-chores", action="store_true", help="also each CLI's shell-chore SFT model")
    parser.add_argument("--eval", action="store_true", help="print the tool-call parse report")
    parser.add_argument("--n", type=int, default=32, help="held-out prompts (plus n/4 with long system prompts)")
    parser.add_argument("--seed", type=int, default=10_000, help="held-out prompt seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = warm_tiny_model_path() if args.warm else tiny_model_path()
    print(path)
    if args.shell_chores:
        for agent, model in shell_chore_models().items():
            print(f"{agent}: {model}")
    if args.eval:
        sets = {
            "short": heldout_prompts(args.n, args.seed),
            "long_system": heldout_prompts(max(1, args.n // 4), args.seed + 1, system_chars=20_000),
        }
        for name, prompts in sets.items():
            for temperature in (0.7, 1.0):
                report = evaluate_tool_calls(path, prompts, temperature, seed=args.seed)
                print(json.dumps({"prompts": name, **report}))


def shell_chore_models() -> dict[str, Path]:
    """Each CLI's shell-chore SFT model on the easy example tasks' instructions, built where not cached."""
    from harness_grpo.harbor_tasks import load_task_dataset
    from harness_grpo.tiny_model.shell_sft import SHELL_CHORE_AGENTS, shell_chore_model

    easy = load_task_dataset(EXAMPLE_TASKS, difficulty="easy")
    instructions = [prompt[0]["content"] for prompt in easy["prompt"]]
    return {agent: shell_chore_model(instructions, agent) for agent in SHELL_CHORE_AGENTS}


if __name__ == "__main__":
    main()
