"""Does a real coding-agent CLI learn on CPU? ``launchers/train.py --harness <cli>`` as users run it, per seed.

    python -m bench.cli_learning                                # mini-swe-agent, easy tasks, seeds 0 1 2
    python -m bench.cli_learning --seeds 0 --max-steps 10 --plot runs/cli-learning.svg

Each run is ``launchers/train.py --harness mini-swe-agent --difficulty easy`` in a process of its own, with
its defaults (the tiny model after the shell-chore SFT on the tasks' instructions, the embedded engine, the
capture proxy, one Harbor trial of the real CLI per rollout in the local sandbox, the task's own verifier)
plus ``--seed``, ``--max_steps`` and any other flags given after ours. Read from the run's
``log_history.json``: the verifier's reward per step (``rollout/correctness_mean``, the mean over the step's
rollouts). Printed per seed: the mean over the first and the last ``--window`` steps, the gain, the wall
time (the SFT is built once, by the first seed, and cached), and per task the rewarded trials of those steps (from
the run's ``rollouts.jsonl``); ``--plot`` writes the curves as an SVG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEY = "rollout/correctness_mean"
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def run(harness: str, seed: int, steps: int, output: Path, extra: list[str]) -> tuple[list[float], float]:
    """One training run; its verifier reward per step and its wall seconds."""
    command = [
        sys.executable,
        str(REPO / "launchers" / "train.py"),
        *("--harness", harness, "--difficulty", "easy", "--seed", str(seed), "--max_steps", str(steps)),
        *("--output_dir", str(output), "--save_steps", str(steps), "--save_rollouts", "true", *extra),
    ]
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    history = json.loads((output / "log_history.json").read_text())
    return [entry[KEY] for entry in history if KEY in entry], time.monotonic() - started


def rewarded_per_task(rollouts: Path, window: int, steps: int) -> dict[str, tuple[int, int, int, int]]:
    """Task -> (rewarded, trials) in the first ``window`` steps, then (rewarded, trials) in the last ``window``
    steps of ``steps``; a trial is rewarded when its verifier reward is above 0."""
    counts: dict[str, list[int]] = {}
    for line in rollouts.read_text().splitlines():
        rollout = json.loads(line)
        first, last = rollout["step"] <= window, rollout["step"] > steps - window
        if not (first or last):
            continue
        tally = counts.setdefault(rollout["task"], [0, 0, 0, 0])
        offset = 0 if first else 2
        tally[offset] += (rollout["env_reward"] or 0) > 0
        tally[offset + 1] += 1
    return {task: (a, b, c, d) for task, (a, b, c, d) in sorted(counts.items())}


def svg_plot(curves: dict[str, list[float]], title: str) -> str:
    """The curves (step -> reward in [0, 1]) as a small SVG line chart, with a 5-step moving mean per curve."""
    width, height, left, bottom, top, right = 640, 360, 50, 40, 30, 120
    steps = max(len(curve) for curve in curves.values())

    def point(step: int, value: float) -> str:
        x = left + (width - left - right) * step / max(steps - 1, 1)
        y = top + (height - top - bottom) * (1 - value)
        return f"{x:.1f},{y:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="14">{title}</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = point(0, tick).split(",")[1]
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y}" y2="{y}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y}" text-anchor="end" dominant-baseline="middle">{tick:g}</text>')
    for step in range(0, steps, 5):
        x = point(step, 0).split(",")[0]
        parts.append(f'<text x="{x}" y="{height - bottom + 16}" text-anchor="middle">{step + 1}</text>')
    parts.append(f'<text x="{(width - right + left) / 2}" y="{height - 6}" text-anchor="middle">step</text>')
    for index, (label, curve) in enumerate(curves.items()):
        colour = COLOURS[index % len(COLOURS)]
        smooth = [statistics.mean(curve[max(0, i - 4) : i + 1]) for i in range(len(curve))]
        raw = " ".join(point(i, v) for i, v in enumerate(curve))
        parts.append(f'<polyline points="{raw}" fill="none" stroke="{colour}" stroke-opacity="0.3"/>')
        line = " ".join(point(i, v) for i, v in enumerate(smooth))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        x, y = width - right + 10, top + 16 * index
        parts.append(f'<text x="{x}" y="{y}" fill="{colour}" dominant-baseline="middle">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", default="mini-swe-agent")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--plot", type=Path, default=None, help="write the curves here as SVG")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's output_dir under this directory")
    args, extra = parser.parse_known_args()
    curves: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        for seed in args.seeds:
            curve, wall_s = run(args.harness, seed, args.max_steps, root / f"{args.harness}-seed{seed}", extra)
            w = min(args.window, len(curve))
            first, last = statistics.mean(curve[:w]), statistics.mean(curve[-w:])
            curves[f"seed {seed}"] = curve
            print(
                f"{args.harness} seed {seed}: verifier reward first {w} steps {first:.3f} -> last {w} steps "
                f"{last:.3f} (gain {last - first:+.3f}) over {len(curve)} steps in {wall_s:.0f} s",
                flush=True,
            )
            print("  per step: " + " ".join(f"{value:.2f}" for value in curve), flush=True)
            tasks = rewarded_per_task(root / f"{args.harness}-seed{seed}" / "rollouts.jsonl", w, len(curve))
            cells = [f"{task} {a}/{b} -> {c}/{d}" for task, (a, b, c, d) in tasks.items()]
            print(f"  rewarded trials, first {w} -> last {w} steps: " + ", ".join(cells), flush=True)
    if args.plot is not None:
        title = f"{args.harness} on the easy tasks, tiny model on 2 CPU cores: verifier reward per step"
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.write_text(svg_plot(curves, title))
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
