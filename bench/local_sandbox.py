"""Local sandbox: start time (``start()`` to the first exec's reply) and oracle trials per minute.

Start time is measured on ``LocalEnvironment`` alone, ``--starts`` times in a row. Throughput runs real
Harbor trials (``Trial.create`` + ``run``, Harbor's own overhead included) of Harbor's ``oracle`` agent,
``--trials`` in all, at most ``--concurrency`` at once, over the tasks in ``--tasks`` (a directory of Harbor
tasks, e.g. ``examples/tasks``) or, without it, three tiny generated tasks. Every trial must score 1.

    .venv/bin/python -m bench.local_sandbox [--starts 10] [--trials 24] [--concurrency 4] [--tasks DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ["HARBOR_TELEMETRY"] = "0"

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.trial.trial import Trial

from harness_grpo.harbor_local import LocalEnvironment

LOCAL_ENV = "harness_grpo.harbor_local:LocalEnvironment"
TINY_TASKS = {
    "answer": ("echo 42 > /app/answer.txt", '[ "$(cat /app/answer.txt)" = 42 ]'),
    "sorted": ("sort /app/words.txt > /app/sorted.txt", "sort /app/words.txt | cmp -s - /app/sorted.txt"),
    "python": ("python3 -c 'print(sum(range(10)))' > /app/sum.txt", '[ "$(cat /app/sum.txt)" = 45 ]'),
}


def write_tiny_tasks(parent: Path) -> list[Path]:
    """Three Harbor tasks that a shell command solves; each verifier writes reward.txt."""
    tasks = []
    for name, (solve, check) in TINY_TASKS.items():
        task = parent / name
        (task / "environment" / "app").mkdir(parents=True)
        (task / "environment" / "app" / "words.txt").write_text("pear\napple\nfig\n")
        (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\nCOPY app/ /app/\n")
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text(
            f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        )
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
        (task / "instruction.md").write_text(f"Task {name}.\n")
        (task / "task.toml").write_text(
            'schema_version = "1.4"\n\n[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 60.0\n\n'
            '[environment]\nworkdir = "/app"\n'
        )
        tasks.append(task)
    return tasks


async def start_times(count: int, scratch: Path) -> list[float]:
    """Seconds from ``start()`` to the first exec's reply, one per fresh sandbox."""
    environment_dir = write_tiny_tasks(scratch / "start-tasks")[0] / "environment"
    seconds = []
    for index in range(count):
        trial_dir = scratch / f"start-{index}"
        trial_dir.mkdir()
        env = LocalEnvironment(
            environment_dir=environment_dir,
            environment_name="start",
            session_id=f"start-{index}__env",
            trial_paths=TrialPaths(trial_dir=trial_dir),
            task_env_config=TaskEnvironmentConfig(workdir="/app"),
        )
        began = time.perf_counter()
        await env.start(force_build=False)
        result = await env.exec("true")
        seconds.append(time.perf_counter() - began)
        await env.stop(delete=True)
        if result.return_code != 0:
            raise RuntimeError(f"first exec failed: {result}")
    return seconds


async def oracle_throughput(tasks: list[Path], trials: int, concurrency: int, scratch: Path) -> tuple[float, list]:
    """Wall seconds for ``trials`` oracle trials at ``concurrency``, and their rewards."""
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int):
        async with gate:
            config = TrialConfig(
                task=TaskConfig(path=tasks[index % len(tasks)]),
                trials_dir=scratch / "trials",
                agent=AgentConfig(name="oracle"),
                environment=EnvironmentConfig(import_path=LOCAL_ENV),
            )
            result = await (await Trial.create(config)).run()
            rewards = result.verifier_result.rewards if result.verifier_result else None
            return tasks[index % len(tasks)].name, rewards, result.exception_info

    began = time.perf_counter()
    results = await asyncio.gather(*(one(index) for index in range(trials)))
    return time.perf_counter() - began, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tasks", type=Path, default=None, help="a directory of Harbor tasks (default: generated)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-local-sandbox-") as tmp:
        scratch = Path(tmp)
        if args.tasks is not None:
            tasks = sorted(path for path in args.tasks.iterdir() if (path / "task.toml").is_file())
        else:
            tasks = write_tiny_tasks(scratch / "tasks")
        starts = asyncio.run(start_times(args.starts, scratch))
        wall, results = asyncio.run(oracle_throughput(tasks, args.trials, args.concurrency, scratch))
    print(f"cpus: {os.cpu_count()}")
    print(
        f"sandbox start -> first exec: median {statistics.median(starts) * 1000:.0f} ms, "
        f"min {min(starts) * 1000:.0f} ms, max {max(starts) * 1000:.0f} ms over {len(starts)} starts"
    )
    failed = [(name, rewards, error) for name, rewards, error in results if error is not None or not rewards]
    scored = [rewards.get("reward") for _, rewards, error in results if rewards]
    print(
        f"oracle trials: {len(results)} over {len(tasks)} tasks at concurrency {args.concurrency}: "
        f"{wall:.1f} s, {len(results) / wall * 60:.0f} trials/min, mean reward "
        f"{statistics.mean(scored) if scored else float('nan'):.3f}, failed {len(failed)}"
    )
    for name, rewards, error in failed:
        print(f"  {name}: rewards={rewards} error={error.exception_type if error else None}")


if __name__ == "__main__":
    main()
