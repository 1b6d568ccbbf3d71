"""Rollout services side by side: ``openenv harbor serve`` and ours (``python -m harness_grpo.serve``), one run.

Both serve ``examples/tasks`` with the local sandbox (OpenEnv's through ``python -m harness_grpo.openenv_harbor``), in
front of one engine: ``python -m harness_grpo.engine`` with the warm tiny model, behind a recording relay that keeps
every completion the engine served. The same client, ``HarborSessionFactory`` driven by the trainer's ``run_rollout``,
runs ``--trials`` terminus-2 rollouts (the only model-calling harness both run in the local sandbox: OpenEnv
installs the other CLIs inside the sandbox, which has no network) over the tasks in turn, ``--concurrency`` at a
time, on each service, in two settings:

- ``capped``: ``agent_step_limit=--max-calls`` (the proxy's call budget, as the trainer sets it) and the agent timeout
  ``--agent-timeout``;
- ``uncapped``: no call budget, the same timeout (both agents run until it: the tiny model never finishes a task).

Printed per service and setting: trials per minute, model calls captured per minute, how the rollouts ended (ok,
timed out, failed), the proxy's budget answers (OpenEnv's result field), and exactness: captured turns that are an
engine-served call (prompt ids, sampled ids and logprobs equal), and engine-served calls of the rollouts (their
request carries a task's instruction) that are in no trace (a call in flight when the agent was stopped).

    .venv/bin/python -m bench.rollout_services [--trials 6] [--concurrency 2] [--max-calls 2] [--agent-timeout 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness_grpo.harbor_service_sessions import HarborSessionFactory
from harness_grpo.rollouts import run_rollout
from harness_grpo.service_loop import ServiceLoop
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path
from tests.agents.conftest import RecordingRelay, ServedCall, _start_embedded, _stop_process
from tests.service.conftest import SERVICES, Service, start_service

REPO = Path(__file__).resolve().parents[1]
POLICY = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def measure(
    service: Service, relay: RecordingRelay, llm_url: str, args: argparse.Namespace, step_limit: int, setting: str
) -> None:
    factory = HarborSessionFactory(
        service.url,
        harness="terminus-2",
        sandbox="local",
        llm_url=llm_url,
        agent_step_limit=step_limit,
        agent_timeout_sec=args.agent_timeout,
        sampling=dict(POLICY),
    )
    rows = factory.prompt_rows()
    instructions = [row["prompt"][0]["content"] for row in rows]
    sessions: list = []
    real_create = factory.create

    def create(*a, **kw):  # keep each session, for what its result says beyond the outcome
        session = real_create(*a, **kw)
        sessions.append(session)
        return session

    factory.create = create  # type: ignore[method-assign]
    before = len(relay.served)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        outcomes = list(
            pool.map(
                lambda i: run_rollout(
                    factory, rows[i % len(rows)], seed=i, timeout_s=args.agent_timeout, sampling=POLICY
                ),
                range(args.trials),
            )
        )
    elapsed = time.perf_counter() - started
    served = [call for call in relay.served[before:] if carries_a_task(call, instructions)]
    turns = [turn for o in outcomes if o.training_trace is not None for turn in o.training_trace.turns]
    exact, claimed = 0, set()
    for turn in turns:
        index = _claim(served, claimed, turn)
        exact += index is not None
    timed_out = sum(o.timed_out for o in outcomes)
    failed = [o.error for o in outcomes if o.error]
    budget = sum(s.result.budget_stop_count for s in sessions if s.result is not None)
    print(
        f"{service.kind:8} {setting:9} {args.trials} trials at concurrency {args.concurrency}: {elapsed:6.1f} s = "
        f"{60 * args.trials / elapsed:5.1f} trials/min, {60 * len(turns) / elapsed:5.1f} captured calls/min; "
        f"ended ok {args.trials - timed_out - len(failed)}, timed out {timed_out}, failed {len(failed)}; "
        f"budget answers {budget}; exact {exact}/{len(turns)} turns; served calls in no trace "
        f"{len(served) - len(claimed)}/{len(served)}; rewards {sorted({o.env_reward for o in outcomes}, key=str)}"
        + (f"; failures {failed[:2]}" if failed else ""),
        flush=True,
    )


def carries_a_task(call: ServedCall, instructions: list[str]) -> bool:
    """Whether the call's request holds one of the tasks' instructions (a rollout's call; the probes do not)."""
    texts = [message.get("content") for message in call.request.get("messages") or []]
    text = "\n".join(t for t in texts if isinstance(t, str))
    return any(instruction in text for instruction in instructions)


def _claim(served: list[ServedCall], claimed: set[int], turn) -> int | None:
    for index, call in enumerate(served):
        if index not in claimed and (call.prompt_ids, call.completion_ids, call.logprobs) == (
            turn.prompt_token_ids,
            turn.completion_token_ids,
            turn.per_token_logps,
        ):
            claimed.add(index)
            return index
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-calls", type=int, default=2)
    parser.add_argument("--agent-timeout", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        engine = _start_embedded(logs, model=str(warm_tiny_model_path()))
        loop = ServiceLoop("relay")
        relay = RecordingRelay(engine.url)
        llm_url = loop.run(relay.start())
        services: list[Service] = []
        try:
            with ThreadPoolExecutor(2) as pool:
                starts = [
                    pool.submit(
                        start_service, kind, REPO / "examples" / "tasks", llm_url, logs, max_concurrent=args.concurrency
                    )
                    for kind in SERVICES
                ]
                for start in starts:  # every one that started is stopped below, also when another did not
                    if start.exception() is None:
                        services.append(start.result())
                for start in starts:
                    start.result()
            for setting, step_limit in (("capped", args.max_calls), ("uncapped", 0)):
                for service in services:
                    measure(service, relay, llm_url, args, step_limit, setting)
        finally:
            for service in services:
                service.process.stop()
            loop.run(relay.stop())
            loop.close()
            _stop_process(engine)


if __name__ == "__main__":
    main()
