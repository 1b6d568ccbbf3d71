"""Cold sandbox templates prepared one at a time, before concurrent rollouts start.

A cloud sandbox (e2b) builds a task's template the first time a trial of it starts and caches it by the task's
environment definition. Two trials that start together on a cold template both build it and one of them fails
(the template's alias exists as soon as a build starts). ``warm_templates`` runs, for each distinct environment
definition among the tasks (``environment_digest``: the files under ``environment/`` and the ``[environment]``
table of ``task.toml``), one Harbor trial with Harbor's ``nop`` agent (no model, nothing to capture), one after
the other, each bounded by ``timeout_s``. A trial that fails before or while starting its environment is reported
with Harbor's exception; the others find the template ready.

    python -m harness_grpo.sandbox_warmup --dataset examples/tasks --sandbox e2b

prints one line per template and exits 1 when any failed (``launchers/job_entry.py`` runs it before the trainer).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness_grpo.harbor_sessions import environment_config
from harness_grpo.harbor_tasks import resolve_task_dirs

TEMPLATE_SANDBOXES = ("e2b",)
"""Sandboxes that build a template per environment definition on first use, which concurrent first uses break."""


def environment_digest(task_dir: Path) -> str:
    """A digest of what a sandbox builds a task's template from: ``environment/`` (paths and bytes) and the
    ``[environment]`` table of ``task.toml``."""
    digest = hashlib.sha256()
    table = tomllib.loads((task_dir / "task.toml").read_text()).get("environment", {})
    digest.update(json.dumps(table, sort_keys=True, default=str).encode())
    root = task_dir / "environment"
    for path in sorted(root.rglob("*")) if root.is_dir() else ():
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def distinct_environments(task_dirs: Sequence[Path]) -> dict[str, Path]:
    """The first task of each distinct environment definition, by ``environment_digest``, in the given order."""
    first: dict[str, Path] = {}
    for task_dir in task_dirs:
        first.setdefault(environment_digest(task_dir), task_dir)
    return first


@dataclass(frozen=True)
class WarmResult:
    """One template's warm-up: the task whose trial built it, how long it took, and Harbor's error (None: ready)."""

    task: str
    digest: str
    seconds: float
    error: str | None


async def _nop_trial(
    task_dir: Path, sandbox: str, environment_kwargs: Mapping[str, Any], trials_dir: Path
) -> str | None:
    """One ``nop`` trial of ``task_dir``; Harbor's exception as ``Type: message``, or None."""
    from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=trials_dir,
        trial_name=f"warm-{task_dir.name[:40]}",
        agent=AgentConfig(name="nop"),
        environment=environment_config(sandbox, dict(environment_kwargs)),
    )
    result = await (await Trial.create(config)).run()
    error = result.exception_info
    return None if error is None else f"{error.exception_type}: {error.exception_message}"


def warm_templates(
    task_dirs: Sequence[Path],
    sandbox: str,
    *,
    environment_kwargs: Mapping[str, Any] | None = None,
    timeout_s: float = 1800.0,
    report: Any = print,
) -> list[WarmResult]:
    """One ``nop`` trial per distinct environment among ``task_dirs`` in ``sandbox``, strictly one after the other
    (module docstring); ``report`` gets one line per template as it finishes."""
    results = []
    with tempfile.TemporaryDirectory(prefix="harness-warmup-") as trials_dir:
        for digest, task_dir in distinct_environments(task_dirs).items():
            started = time.monotonic()
            try:
                run = _nop_trial(task_dir, sandbox, environment_kwargs or {}, Path(trials_dir))
                error = asyncio.run(asyncio.wait_for(run, timeout_s))
            except TimeoutError:
                error = f"TimeoutError: not ready within {timeout_s} s"
            except Exception as exc:  # one template's failure is reported; the next one still gets its turn
                error = f"{type(exc).__name__}: {exc}"
            result = WarmResult(task_dir.name, digest[:12], time.monotonic() - started, error)
            report(
                f"template {result.digest} ({result.task}): "
                + (f"FAILED after {result.seconds:.0f} s: {error}" if error else f"ready in {result.seconds:.1f} s")
            )
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness_grpo.sandbox_warmup", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", required=True, help="Harbor tasks, as launchers/train.py --dataset takes them")
    parser.add_argument("--sandbox", required=True, help="the sandbox the run uses (e2b, or any Harbor environment)")
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="bound on each template's trial")
    args = parser.parse_args(argv)
    results = warm_templates(resolve_task_dirs(args.dataset), args.sandbox, timeout_s=args.timeout_s)
    failed = [result for result in results if result.error]
    print(f"{len(results) - len(failed)} of {len(results)} templates ready", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
