"""Embedded engine: streamed vs non-streamed chat completions, side by side in one run.

Starts ``python -m harness_grpo.engine`` as a subprocess (``engine_throughput.start_engine``)
and, at 1 and 8 concurrent requests of ``--decode-tokens`` tokens (T=1, ``ignore_eos``),
measures per mode the median time to the first sampled token (the first chunk with
``token_ids``; for a non-streamed reply, the whole reply), the median time to the last byte,
and completion tokens/s over the round. Rounds alternate the two modes so that a change in
machine load hits both. Usage: ``.venv/bin/python bench/engine_streaming.py [--model tiny]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import aiohttp
import orjson

from bench.engine_throughput import start_engine

CONCURRENCY = (1, 8)


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, float]:
    """(seconds to the first sampled token, seconds to the end) of one request."""
    start, first = time.perf_counter(), None
    async with session.post(url, data=orjson.dumps(body)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {await resp.text()}")
        async for line in resp.content:
            if first is None and body["stream"] and line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0].get("token_ids"):
                    first = time.perf_counter() - start
    end = time.perf_counter() - start
    return (end if first is None else first), end


async def measure(base_url: str, args: argparse.Namespace) -> dict[tuple[int, bool], tuple[float, float, float]]:
    """``{(concurrency, stream): (median first token s, median total s, tokens/s)}`` over ``args.rounds``."""
    url = f"{base_url}/v1/chat/completions"
    samples: dict[tuple[int, bool], list[tuple[list[tuple[float, float]], float]]] = {}

    def body(i: int, stream: bool) -> dict:
        return {
            "messages": [{"role": "user", "content": f"Write function number {i}."}],
            "max_tokens": args.decode_tokens,
            "temperature": 1.0,
            "seed": i,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            "stream": stream,
        }

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(_one(session, url, body(i, i % 2 == 0)) for i in range(8)))  # warm-up
        for c in CONCURRENCY:
            for r in range(args.rounds):
                for stream in (False, True):
                    start = time.perf_counter()
                    times = await asyncio.gather(*(_one(session, url, body(r * c + i, stream)) for i in range(c)))
                    tokens_per_s = c * args.decode_tokens / (time.perf_counter() - start)
                    samples.setdefault((c, stream), []).append((times, tokens_per_s))
    return {
        key: (
            statistics.median(t[0] for times, _ in rounds for t in times),
            statistics.median(t[1] for times, _ in rounds for t in times),
            statistics.median(tps for _, tps in rounds),
        )
        for key, rounds in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-threads", type=int, default=1, help="engine compute-thread torch threads (0: per core)")
    args = parser.parse_args()
    proc, url = start_engine(args.model, args.num_threads)
    load_before = os.getloadavg()[0]
    try:
        results = asyncio.run(measure(url, args))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"embedded engine, streamed vs not  model={args.model}  cpu_count={os.cpu_count()}  n={args.decode_tokens}")
    print(f"load average before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"{'concurrent':>10} | {'stream':>6} | {'first token ms':>14} | {'total ms':>8} | {'tok/s':>6}")
    for (c, stream), (first, total, tps) in results.items():
        print(f"{c:>10} | {stream!s:>6} | {first * 1000:>14.1f} | {total * 1000:>8.1f} | {tps:>6.0f}")


if __name__ == "__main__":
    main()
