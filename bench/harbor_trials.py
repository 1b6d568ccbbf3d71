"""Harbor trials per minute: ``HarborTrialSessionFactory`` rollouts in the local sandbox, ``--concurrency`` at a time.

For each harness, ``--trials`` rollouts (``harness_grpo.rollouts.run_rollout``, as the trainer runs them) of the
example tasks (``examples/tasks``, in turn) against the capture proxy and the embedded engine serving the
warm-started tiny model, configured for a small model (``SMALL_MODEL_PROMPT``, a ``--max-calls`` budget). Harbor's
``oracle`` (no model, the task's own solution) measures what the sandbox and Harbor cost a trial; the CLIs add
their own start-up and the engine's time. Prints trials per minute, rewards, turns captured, failures.

    .venv/bin/python -m bench.harbor_trials [--trials 8] [--concurrency 4] [--harnesses oracle opencode]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness_grpo.agents import SMALL_MODEL_PROMPT
from harness_grpo.engine.embedded import TINY_WARM, EmbeddedEngine, resolve_model
from harness_grpo.engine.server import EngineServer
from harness_grpo.harbor_sessions import HarborTrialSessionFactory
from harness_grpo.harbor_tasks import load_task_dataset
from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext
from harness_grpo.rollouts import run_rollout
from harness_grpo.service_loop import ServiceLoop
from proxy.server import CaptureProxy, ProxyConfig

REPO = Path(__file__).resolve().parents[1]
SAMPLING = {"temperature": 0.7}


def run_harness(proxy: ProxyEndpoint, harness: str, rows: list, trials: int, concurrency: int, max_calls: int) -> None:
    factory = HarborTrialSessionFactory(harness=harness, sampling=SAMPLING, system_prompt=SMALL_MODEL_PROMPT)
    factory.bind_rollout(
        RolloutContext(proxy, sampling=SAMPLING, max_model_calls=max_calls, max_output_tokens=128, model_name="m")
    )
    started = time.perf_counter()

    def rollout(i: int) -> HarnessRolloutOutcome:
        return run_rollout(factory, rows[i % len(rows)], seed=i, timeout_s=300)

    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(rollout, range(trials)))
    elapsed = time.perf_counter() - started
    turns = [len(o.training_trace.turns) if o.training_trace is not None else 0 for o in outcomes]
    failed = [o.error for o in outcomes if o.error]
    print(
        f"{harness:16} {trials} trials at concurrency {concurrency}: {elapsed:6.1f} s = {60 * trials / elapsed:6.1f} "
        f"trials/min; rewards {[o.env_reward for o in outcomes]}; turns {turns}; failures {failed}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-calls", type=int, default=3)
    parser.add_argument("--harnesses", nargs="+", default=["oracle", "opencode", "mini-swe-agent"])
    args = parser.parse_args()
    rows = list(load_task_dataset(REPO / "examples" / "tasks"))
    loop = ServiceLoop("harbor-trials")
    engine = EmbeddedEngine(resolve_model(TINY_WARM)[0]).start()
    server = EngineServer(engine)
    try:
        engine_url = loop.run(server.start())
        with tempfile.TemporaryDirectory() as tmp:
            proxy = CaptureProxy(ProxyConfig(engine_url=engine_url, journal_dir=Path(tmp) / "journal", port=0))
            endpoint = ProxyEndpoint(f"http://127.0.0.1:{loop.run(proxy.start())}", proxy.admin_key)
            try:
                for harness in args.harnesses:
                    run_harness(endpoint, harness, rows, args.trials, args.concurrency, args.max_calls)
            finally:
                loop.run(proxy.stop())
    finally:
        loop.run(server.stop())
        engine.stop()
        loop.close()


if __name__ == "__main__":
    main()
