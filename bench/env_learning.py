"""Does GRPO learn on CPU through the built-in tool loop? Recipes run as users run them, one process per seed.

    python -m bench.env_learning                              # grpo_echo and grpo_catch, seeds 0 1 2
    python -m bench.env_learning --recipes wordle --window 10        # grpo_wordle's 60 steps, seeds 0 1 2
    python -m bench.env_learning --recipes catch --seeds 0 --max-steps 20

Each run is ``examples/grpo_<name>/grpo_<name>.py`` with its CPU defaults (the tiny model after the
format SFT, the offline env server, the real trainer, proxy and engine) in a process of its own; the
figures are read from the run's ``log_history.json``. Printed per run: the mean over the first and the last
``--window`` steps of the reward, of each reward function and of the tool-call and tool-failure frequencies,
and the wall time (the seed's format SFT included where it was not yet cached).
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


def run(name: str, seed: int, output: Path, extra: list[str]) -> tuple[list[dict], float]:
    """One recipe run; its log history and wall seconds."""
    script = REPO / "examples" / f"grpo_{name}" / f"grpo_{name}.py"
    started = time.monotonic()
    subprocess.run(
        [sys.executable, str(script), "--seed", str(seed), "--output_dir", str(output), *extra],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return json.loads((output / "log_history.json").read_text()), time.monotonic() - started


def window_mean(history: list[dict], key: str, window: int, last: bool) -> float:
    values = [entry.get(key, float("nan")) for entry in history]
    return statistics.mean(values[-window:] if last else values[:window])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=["echo", "catch"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=None, help="Default: each recipe's own.")
    args, extra = parser.parse_known_args()
    if args.max_steps is not None:
        extra += ["--max_steps", str(args.max_steps)]
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.recipes:
            gains = []
            for seed in args.seeds:
                history, wall_s = run(name, seed, Path(scratch) / f"{name}-{seed}", extra)
                w = args.window
                columns = ["reward", *sorted(k for k in history[0] if k.startswith("rewards/") and k.endswith("/mean"))]
                columns += ["tools/call_frequency", "tools/failure_frequency"]
                ends = {key: [window_mean(history, key, w, last) for last in (False, True)] for key in columns}
                gains.append(ends["reward"][1] - ends["reward"][0])
                figures = "  ".join(f"{key.removesuffix('/mean')} {a:.3f} -> {b:.3f}" for key, (a, b) in ends.items())
                print(f"{name} seed {seed}: {len(history)} steps, {wall_s:.0f} s wall; first {w} -> last {w} steps:")
                print(f"    {figures}", flush=True)
            print(f"{name}: reward gain per seed {[round(g, 3) for g in gains]}, mean {statistics.mean(gains):+.3f}")


if __name__ == "__main__":
    main()
