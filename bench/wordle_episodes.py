"""Wordle episodes per second against the local server, ``--concurrency`` episodes at once.

Each of ``--concurrency`` threads plays episodes back to back through ``WordleToolEnv`` (the class a
trainer's rollouts use: one sync client and one server session per episode in flight), with a
scripted guesser that keeps the answers consistent with the feedback so far and guesses the first
of them. ``--episodes`` in all, each seeded by its index. Printed: episodes/s and guesses/s, the
latency of one guess as the tool sees it (p50, p95), and CPU time per guess in the server process
and in this (client) process. The server is ``python -m harness_grpo.envs wordle`` started here on
loopback, or ``--env-url``.

    .venv/bin/python -m bench.wordle_episodes [--concurrency 16] [--episodes 480] [--env-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.envs.wordle import WordleToolEnv
from harness_grpo.envs.wordle.game import score_guess
from harness_grpo.envs.wordle.words import ANSWERS


def feedback_row(reply: str) -> list[str] | None:
    """The G/Y/X row of a guess's feedback (``None`` when the reply has none: a win or a refusal)."""
    lines = reply.split("\n")
    if "Feedback:" not in lines:
        return None
    return lines[lines.index("Feedback:") + 2].split()


def play(env: WordleToolEnv, seed: int, latencies: list[float]) -> tuple[int, float]:
    """One episode; its number of guesses and its reward."""
    env.reset(seed=seed)
    candidates = sorted(ANSWERS)
    guesses = 0
    while not env.done:
        guess = candidates[0]
        started = time.perf_counter()
        reply = env.guess(guess)
        latencies.append(time.perf_counter() - started)
        guesses += 1
        row = feedback_row(reply)
        if row is not None:
            candidates = [word for word in candidates if word != guess and score_guess(guess, word) == row]
    return guesses, env.reward


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(url: str, concurrency: int, episodes: int) -> dict[str, float]:
    next_episode = iter(range(episodes))
    lock = threading.Lock()
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    results: list[tuple[int, float]] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        env = WordleToolEnv(base_url=url)
        try:
            while True:
                with lock:
                    seed = next(next_episode, None)
                if seed is None:
                    return
                outcome = play(env, seed, latencies[index])
                with lock:
                    results.append(outcome)
        except BaseException as exc:
            errors.append(exc)
        finally:
            env._close()

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    steps = [latency for per_thread in latencies for latency in per_thread]
    quantiles = statistics.quantiles(steps, n=20)
    return {
        "episodes": len(results),
        "seconds": elapsed,
        "episodes_per_s": len(results) / elapsed,
        "guesses_per_s": len(steps) / elapsed,
        "guess_p50_ms": statistics.median(steps) * 1e3,
        "guess_p95_ms": quantiles[18] * 1e3,
        "win_rate": sum(reward == 1.0 for _, reward in results) / len(results),
        "guesses_per_episode": statistics.mean(guesses for guesses, _ in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=480)
    parser.add_argument("--env-url", default="", help="a running Wordle server (default: start one here)")
    args = parser.parse_args()
    server = None if args.env_url else LocalEnvServer("wordle", max_concurrent_envs=max(64, args.concurrency))
    url = args.env_url or server.url  # type: ignore[union-attr]
    try:
        run(url, args.concurrency, args.concurrency)  # warm-up: connections, imports, first games
        server_cpu = cpu_seconds(server.pid) if server else 0.0
        client_cpu = time.process_time()
        figures = run(url, args.concurrency, args.episodes)
        steps = figures["guesses_per_s"] * figures["seconds"]
        client_ms = (time.process_time() - client_cpu) / steps * 1e3
        server_ms = (cpu_seconds(server.pid) - server_cpu) / steps * 1e3 if server else float("nan")
    finally:
        if server is not None:
            server.stop()
    print(f"wordle, {args.concurrency} concurrent episodes, {figures['episodes']:.0f} episodes, {os.cpu_count()} CPUs")
    print(f"  episodes/s        {figures['episodes_per_s']:8.1f}")
    print(f"  guesses/s         {figures['guesses_per_s']:8.1f}")
    print(f"  guess latency     p50 {figures['guess_p50_ms']:.2f} ms, p95 {figures['guess_p95_ms']:.2f} ms")
    print(f"  CPU per guess     server {server_ms:.2f} ms, client {client_ms:.2f} ms")
    win_rate, guesses = figures["win_rate"], figures["guesses_per_episode"]
    print(f"  scripted guesser  win rate {win_rate:.2f}, {guesses:.2f} guesses/episode")


if __name__ == "__main__":
    main()
