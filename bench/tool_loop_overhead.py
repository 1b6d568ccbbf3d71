"""What the built-in tool loop costs per turn, beside the engine's own time.

    python -m bench.tool_loop_overhead                      # 24 Catch episodes, one at a time
    python -m bench.tool_loop_overhead --episodes 48 --concurrency 4
    python -m bench.tool_loop_overhead --engine_enable_prefix_caching false   # any HarnessGRPOConfig flag

Real parts: the offline Catch server, the trainer's capture proxy and embedded engine, the tiny model after
``grpo_catch``'s format SFT (cached; built on first use), ``CatchToolEnv`` through ``run_rollout`` as the
trainer runs it. Per model turn (medians over all turns, milliseconds):

- ``model call``: the tool loop's chat call as it waits for it (HTTP to the proxy, the proxy, the engine);
- ``proxy + engine``: the same call as the proxy timed it (``proxy_call_seconds``): the engine's own time
  plus the proxy's, which ``bench/proxy_vs_openenv.py`` measures on its own (about a millisecond);
- ``loop``: what the tool loop adds between two calls: the tool calls (a WebSocket round trip to the game
  server each), the tool-suffix token count (``ToolSuffixLength``: two template renderings) and building
  the next request;
- of which ``tools`` and ``suffix``;

and per episode, what ``run_rollout`` spends outside the loop: the proxy session, the environment's ``reset``
(a new game session on the server), the trace fetch and the close.

The ratio ``loop / model call`` is the share of a rollout's time the loop itself adds.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.grpo_catch import grpo_catch  # noqa: E402
from examples.recipe import parse, tiny_policy  # noqa: E402
from harness_grpo.envs.serving import LocalEnvServer  # noqa: E402
from harness_grpo.rollouts import run_rollout  # noqa: E402
from harness_grpo.tool_loop import ToolLoopSession  # noqa: E402
from harness_grpo.trainer import HarnessAsyncGRPOTrainer  # noqa: E402


def proxy_call_seconds(proxy_url: str) -> tuple[float, int]:
    """The proxy's ``proxy_call_seconds`` sum and count."""
    with urllib.request.urlopen(f"{proxy_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    total = float(re.search(r"^proxy_call_seconds_sum (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"^proxy_call_seconds_count (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    return total, count


def _timed[**P, R](fn: Callable[P, R], sink: list[float]) -> Callable[P, R]:
    """``fn``, appending each call's seconds to ``sink``."""

    @functools.wraps(fn)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)

    return timed


class Timed:
    """Times every ``ToolLoopSession.chat_completion``, ``wait_for_completion`` (the loop itself) and the
    factory's suffix count."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.suffix: list[float] = []
        self.loops: list[float] = []

    def install(self, trainer: HarnessAsyncGRPOTrainer) -> None:
        ToolLoopSession.chat_completion = _timed(ToolLoopSession.chat_completion, self.calls)  # type: ignore[method-assign]
        ToolLoopSession.wait_for_completion = _timed(ToolLoopSession.wait_for_completion, self.loops)  # type: ignore[method-assign]
        trainer.session_factory.suffix_length = _timed(trainer.session_factory.suffix_length, self.suffix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=1)
    args, settings = parser.parse_known_args()  # the rest: HarnessGRPOConfig flags, as the recipe takes them
    recipe = grpo_catch.RECIPE
    with LocalEnvServer("catch") as server, tempfile.TemporaryDirectory() as scratch:
        os.environ[grpo_catch.CatchToolEnv.url_variable] = server.url
        recipe_args, config = parse(recipe, ["--output_dir", scratch, *settings])  # the recipe's CPU settings
        model = tiny_policy(recipe, recipe_args.sft_episodes, recipe_args.sft_steps, config.seed)
        rows = recipe.dataset(args.episodes)
        trainer = HarnessAsyncGRPOTrainer(
            model,
            args=config,
            train_dataset=rows,
            reward_funcs=list(recipe.reward_funcs),
            environment_factory=recipe.environment_factory,
        )
        timed = Timed()
        timed.install(trainer)
        trainer._start_services()
        try:
            assert trainer.services is not None and trainer.services.proxy_endpoint is not None
            proxy_url = trainer.services.proxy_endpoint.base_url
            run_rollout(trainer.session_factory, rows[0], seed=0, timeout_s=300)  # warm-up, not counted
            timed.calls.clear()
            timed.suffix.clear()
            timed.loops.clear()
            before = proxy_call_seconds(proxy_url)
            tool_s: list[float] = []

            rollout_s: list[float] = []

            def episode(index: int) -> None:
                started = time.perf_counter()
                outcome = run_rollout(trainer.session_factory, rows[index], seed=index, timeout_s=300)
                rollout_s.append(time.perf_counter() - started)
                assert outcome.error is None, outcome.error
                tool_s.extend(seconds for _, seconds in outcome.tool_latency_s)

            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(episode, range(args.episodes)))
            wall_s = time.perf_counter() - started
            after = proxy_call_seconds(proxy_url)
        finally:
            trainer._stop_services()
    turns = len(timed.calls)
    proxy_ms = 1000 * (after[0] - before[0]) / (after[1] - before[1])
    call_ms = 1000 * statistics.mean(timed.calls)
    loop_ms = 1000 * (sum(timed.loops) - sum(timed.calls)) / turns
    tools_ms = 1000 * sum(tool_s) / turns
    suffix_ms = 1000 * sum(timed.suffix) / turns
    session_ms = 1000 * (sum(rollout_s) - sum(timed.loops)) / len(rollout_s)
    print(f"{args.episodes} Catch episodes, {turns} model turns, concurrency {args.concurrency}, {wall_s:.1f} s wall")
    print(f"per turn (means, ms): model call {call_ms:.1f} | proxy + engine {proxy_ms:.1f} | loop {loop_ms:.1f}")
    print(f"  loop = tools {tools_ms:.1f} + suffix {suffix_ms:.1f} + the rest {loop_ms - tools_ms - suffix_ms:.1f}")
    print(f"loop / model call: {loop_ms / call_ms:.3f}; client hop (call - proxy+engine): {call_ms - proxy_ms:.1f} ms")
    print(f"per episode, outside the loop (session, reset, trace, close): {session_ms:.1f} ms")


if __name__ == "__main__":
    main()
