"""``python -m harness_grpo.engine --model PATH|tiny --host 127.0.0.1 --port N``: serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from harness_grpo.engine.embedded import TINY, EmbeddedEngine
from harness_grpo.engine.server import EngineServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m harness_grpo.engine", description=__doc__)
    parser.add_argument(
        "--model",
        default=TINY,
        help="model path or hub id; 'tiny' / 'tiny-warm' build the tiny Qwen3 model (warm-started)",
    )
    parser.add_argument("--served-model-name", default=None, help="name clients send as 'model'")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in flight at once")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=2048, help="prompt tokens prefilled per step")
    parser.add_argument("--request-timeout-s", type=float, default=3600.0)
    parser.add_argument("--control-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--num-threads", type=int, default=1, help="torch intra-op threads of the compute thread; 0: one per core"
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep finished sequences' KV so a prompt that starts with one prefills only the rest (vLLM's flag)",
    )
    parser.add_argument("--prefix-cache-mb", type=int, default=512, help="the prefix cache's size bound")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace, engine: EmbeddedEngine) -> None:
    server = EngineServer(
        engine,
        args.host,
        args.port,
        request_timeout_s=args.request_timeout_s,
        control_timeout_s=args.control_timeout_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start()
    print(f"engine ready: {url} serving {engine.served_model_name}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Load the model, start the compute thread, serve HTTP until a signal."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = EmbeddedEngine(
        args.model,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        num_threads=args.num_threads,
        enable_prefix_caching=args.enable_prefix_caching,
        prefix_cache_bytes=args.prefix_cache_mb << 20,
    ).start()
    try:
        asyncio.run(_serve(args, engine))
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
