"""The token-in bridge's payoff and cost: 64 sessions of 32 turns of an agent that re-serialises its tool calls.

The fake engine (``bench/fake_vllm.py``: ``/tokenize``, the token route, tool-call arguments written as vLLM
writes them) and the proxy (``python -m proxy``) run as processes; this process is the agents, ``--concurrency``
sessions at a time, each sending every tool call back compactly (``{"command":"..."}``, as claude-code does)
with a ``--tool-chars`` tool result, and "Continue." after a text reply. The same load runs with the bridge
off and on (the session option ``bridge``), side by side:

- proxy CPU per call: the proxy process's CPU time (``/proc/PID/stat``) over the load, per call;
- tokens the trainer reads: each session's trace (``GET /sessions/{id}/trace``) into sequences
  (``sequences_from_trace``) and rows (``rollout_rows``, the trainer's row builder), the sum of row lengths;
- trainer step time on those rows: ``bench.trainer_step.run`` (the tiny model on CPU, padded micro-batches of
  ``--budget`` tokens, one AdamW step), the fake engine's ids folded into the tiny model's vocabulary.

    .venv/bin/python -m bench.bridge_cost [--sessions 64] [--turns 32] [--concurrency 8] [--no-step]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import torch
from transformers import AutoModelForCausalLM

from bench.proxy_vs_openenv import BASH_TOOL, proc_cpu_s, system_prompt, tool_output
from bench.trainer_step import run as trainer_step
from harness_grpo.rows import Row, rollout_rows
from harness_grpo.tiny_model import tiny_model_path
from proxy.capture_graph import TrainingSequence, sequences_from_trace
from proxy.client import ProxyAdminClient
from proxy.trace import TrainingTrace

REPO = Path(__file__).resolve().parents[1]


def start(argv: list[str], ready: str) -> tuple[subprocess.Popen, str]:
    """Start ``argv`` in the repository; returns it and the first line of its output that matches ``ready``."""
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ}
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.search(ready, line):
            return proc, line
    raise RuntimeError(f"{argv} exited before it was ready")


async def agent(http: aiohttp.ClientSession, url: str, key: str, turns: int, tool_chars: int, seed: int) -> None:
    """One session of ``turns`` calls that re-serialises each tool call compactly."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(1000)},
        {"role": "user", "content": f"[{seed}] Fix the failing test in the repository."},
    ]
    headers = {"Authorization": f"Bearer {key}"}
    for _ in range(turns):
        body = {"model": "m", "messages": messages, "tools": BASH_TOOL, "max_tokens": 256}
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            message = orjson.loads(await resp.read())["choices"][0]["message"]
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": orjson.dumps(orjson.loads(call["function"]["arguments"])).decode(),
                },
            }
            for call in message.get("tool_calls") or []
        ]
        messages.append(
            {"role": "assistant", "content": message.get("content"), **({"tool_calls": calls} if calls else {})}
        )
        for call in calls:
            command = orjson.loads(call["function"]["arguments"]).get("command", "")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(command)[:tool_chars]})
        if not calls:
            messages.append({"role": "user", "content": "Continue."})


async def load(url: str, keys: list[str], turns: int, tool_chars: int, concurrency: int) -> None:
    """Every session's agent, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int, key: str) -> None:
        async with gate:
            await agent(http, url, key, turns, tool_chars, seed)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await asyncio.gather(*(one(seed, key) for seed, key in enumerate(keys)))


def rows_of(traces: list[TrainingTrace], vocab: int) -> list[Row]:
    """The trainer's rows of each trace (advantage +1/-1 alternating), ids folded into ``vocab``."""
    rows: list[Row] = []
    for i, trace in enumerate(traces):
        sequences = [
            TrainingSequence([t % vocab for t in s.token_ids], s.loss_mask, s.logprobs, s.node_ids, s.role)
            for s in sequences_from_trace(trace)
        ]
        rows += rollout_rows(sequences, 1.0 if i % 2 else -1.0, policy_version=0, rollout_id=f"r{i}", group_id="g")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8, help="sessions running at once")
    parser.add_argument("--tool-chars", type=int, default=200, help="characters of each tool result")
    parser.add_argument("--budget", type=int, default=8192, help="trainer micro-batch token budget")
    parser.add_argument("--no-step", dest="step", action="store_false", help="skip the trainer step (quick mode)")
    a = parser.parse_args()

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    model.train()
    vocab = model.config.vocab_size
    engine, line = start([sys.executable, "-m", "bench.fake_vllm", "--port", "0"], r"fake vLLM on ")
    engine_url = line.split()[-1]
    results: dict[bool, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bridge-cost-") as journal:
        argv = [sys.executable, "-m", "proxy", "--engine-url", engine_url, "--journal-dir", journal, "--port", "0"]
        proxy, line = start(argv, r"proxy listening on ")
        try:
            url = re.search(r"(http://\S+)", line).group(1)  # type: ignore[union-attr]
            admin = ProxyAdminClient(url, re.search(r"admin_key=(\S+)", line).group(1))  # type: ignore[union-attr]
            for bridge in (False, True):
                sessions = [admin.create_session(bridge=bridge) for _ in range(a.sessions)]
                cpu, started = proc_cpu_s(proxy.pid), time.perf_counter()
                asyncio.run(load(url, [s.api_key for s in sessions], a.turns, a.tool_chars, a.concurrency))
                wall, cpu = time.perf_counter() - started, proc_cpu_s(proxy.pid) - cpu
                traces = [admin.trace(s.session_id) for s in sessions]
                calls = sum(len(t.turns) for t in traces)
                rows = rows_of(traces, vocab)
                step = trainer_step(model, rows, a.budget, "padded", True) if a.step else {"step_s": float("nan")}
                results[bridge] = {
                    "cpu_ms": cpu * 1e3 / calls,
                    "wall_s": wall,
                    "rows": len(rows),
                    "tokens": sum(len(r.input_ids) for r in rows),
                    "trained": sum(r.n_trainable for r in rows),
                    "step_s": step["step_s"],
                }
                print(f"  bridge={bridge}: {calls} calls in {wall:.0f} s, step {step['step_s']:.1f} s", flush=True)
        finally:
            for proc in (proxy, engine):
                proc.terminate()
                proc.wait(30)
    off, on = results[False], results[True]
    print(
        f"\n{a.sessions} sessions x {a.turns} turns, tool calls re-serialised compactly, {a.tool_chars}-char tool "
        f"results; os.cpu_count()={os.cpu_count()} torch threads={torch.get_num_threads()}"
    )
    print(f"{'':34}{'bridge off':>12}{'bridge on':>12}{'on/off':>9}")
    for name, key, fmt in (
        ("proxy CPU per call (ms)", "cpu_ms", "{:.2f}"),
        ("rows", "rows", "{:.0f}"),
        ("tokens the trainer reads", "tokens", "{:.0f}"),
        ("of them trained (agent paths)", "trained", "{:.0f}"),
        (f"trainer step (s, budget {a.budget})", "step_s", "{:.1f}"),
    ):
        print(f"{name:34}{fmt.format(off[key]):>12}{fmt.format(on[key]):>12}{on[key] / off[key]:>8.2f}x")


if __name__ == "__main__":
    main()
