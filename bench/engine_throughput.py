"""Embedded engine throughput through its real HTTP server, at 1 and 8 concurrent requests.

Starts ``python -m harness_grpo.engine`` as a subprocess on a free port and
measures, side by side in one run:

- prefill tokens/s: token-in ``/v1/completions`` with ``--prompt-len`` random
  ids and ``max_tokens=1`` (prompt tokens / wall time);
- decode tokens/s: ``/v1/chat/completions`` with a short prompt and
  ``--decode-tokens`` sampled tokens at T=1 (completion tokens / wall time).

Each figure is the median over ``--rounds`` rounds of ``c`` simultaneous
requests. Usage: ``.venv/bin/python bench/engine_throughput.py [--model tiny]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8)


def start_engine(model: str, num_threads: int, timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
    """The engine subprocess and its base URL, once it prints its ready line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "harness_grpo.engine", "--model", model, "--port", "0", "--log-level", "WARNING"]
    command += ["--num-threads", str(num_threads)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    ready: list[str] = []
    found = threading.Event()

    def drain() -> None:
        for line in proc.stdout:
            if line.startswith("engine ready: ") and not found.is_set():
                ready.append(line.split()[2])
                found.set()

    threading.Thread(target=drain, daemon=True).start()
    if not found.wait(timeout_s):
        proc.kill()
        raise TimeoutError(f"engine not ready within {timeout_s}s")
    return proc, ready[0]


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {data}")
        return data


async def _round(session: aiohttp.ClientSession, url: str, bodies: list[dict], key: str) -> float:
    """Tokens per second of one round of simultaneous requests, counting ``usage[key]``."""
    start = time.perf_counter()
    responses = await asyncio.gather(*(_post(session, url, body) for body in bodies))
    elapsed = time.perf_counter() - start
    return sum(r["usage"][key] for r in responses) / elapsed


async def measure(base_url: str, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """``{concurrency: (prefill tok/s, decode tok/s)}``."""
    rng = random.Random(0)
    results = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        completions, chat = f"{base_url}/v1/completions", f"{base_url}/v1/chat/completions"

        def prefill_body() -> dict:
            prompt = [rng.randrange(10, 8000) for _ in range(args.prompt_len)]
            return {"prompt": prompt, "max_tokens": 1, "temperature": 1.0}

        def decode_body(i: int) -> dict:
            return {
                "messages": [{"role": "user", "content": f"Write function number {i}."}],
                "max_tokens": args.decode_tokens,
                "temperature": 1.0,
                "seed": i,
                "logprobs": True,
                "top_logprobs": 0,
                "return_token_ids": True,
            }

        await _round(session, completions, [prefill_body() for _ in range(2)], "prompt_tokens")  # warm-up
        await _round(session, chat, [decode_body(i) for i in range(8)], "completion_tokens")
        for c in CONCURRENCY:
            prefill = [
                await _round(session, completions, [prefill_body() for _ in range(c)], "prompt_tokens")
                for _ in range(args.rounds)
            ]
            decode = [
                await _round(session, chat, [decode_body(r * c + i) for i in range(c)], "completion_tokens")
                for r in range(args.rounds)
            ]
            results[c] = (statistics.median(prefill), statistics.median(decode))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=1, help="engine compute-thread torch threads (0: per core)")
    args = parser.parse_args()
    proc, url = start_engine(args.model, args.num_threads)
    load_before = os.getloadavg()[0]
    try:
        results = asyncio.run(measure(url, args))
    finally:
        proc.terminate()
        proc.wait(30)
    threads = args.num_threads or "torch default"
    print(f"embedded engine throughput via HTTP  model={args.model}  cpu_count={os.cpu_count()}  threads={threads}")
    print(f"load average before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"prefill: {args.prompt_len}-token prompts, max_tokens=1; decode: {args.decode_tokens} tokens at T=1")
    print(f"{'concurrent':>10} | {'prefill tok/s':>13} | {'decode tok/s':>12}")
    for c, (prefill, decode) in results.items():
        print(f"{c:>10} | {prefill:>13.0f} | {decode:>12.0f}")
    low, high = CONCURRENCY
    print(f"decode ratio {high}-concurrent / {low}-concurrent: {results[high][1] / results[low][1]:.2f}x")
    print(f"prefill ratio {high}-concurrent / {low}-concurrent: {results[high][0] / results[low][0]:.2f}x")


if __name__ == "__main__":
    main()
