"""GPU check of vLLM's NCCL weight sync: ``VLLMNCCLWeightSync`` against a real ``vllm serve``.

One command, bounded as a whole by ``--timeout-s`` (a watchdog kills vLLM and exits 124 even if a
CUDA or NCCL call never returns):

    python bench/vllm_weight_sync_gpu.py --timeout-s 480 --check [--syncs 10] [--vllm-gpu 0 --trainer-gpu 1]

1. Starts ``vllm serve MODEL`` on ``--vllm-gpu`` with ``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config
   '{"backend":"nccl"}'``, a modest ``--gpu-memory-utilization`` and the flags of REFERENCE §1.1
   (``--logprobs-mode processed_logprobs``, ``--return-tokens-as-token-ids``, ``--enable-auto-tool-choice
   --tool-call-parser hermes``); loads the same model (bf16) on ``--trainer-gpu`` in this process meanwhile.
2. Joins vLLM's weight-transfer group (``VLLMNCCLWeightSync.init``) and runs ``--syncs`` syncs, printing
   the first (cold) and the median / p90 of the rest in seconds.
3. ``--check``: the greedy logprobs of a fixed token-id prompt change after the trainer's weights are
   perturbed and synced, match the trainer's own teacher-forced logprobs of the same tokens, and come
   back to the original after the original weights are synced again.

On one GPU, vLLM and the trainer share it, and NCCL refuses two ranks of one communicator on one
device ("Duplicate GPU detected"), so the init is expected to fail: the script says so, exits 3 and
asks for two GPUs (``--vllm-gpu 0 --trainer-gpu 1``; REFERENCE §1.1 "Placement"). vLLM's ``ipc``
weight-transfer backend is the one meant for a shared GPU; this project does not drive it.

The last line printed is ``RESULT {json}``. Exit codes: 0 ok, 1 a sync or a check failed, 2 no CUDA
or no vLLM, 3 the NCCL group could not be formed (same GPU), 124 the time limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

EXIT_OK, EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_SAME_GPU, EXIT_TIMEOUT = 0, 1, 2, 3, 124
CHECK_PROMPT = "The capital of France is"
SAME_GPU_HINT = (
    "NCCL does not allow two ranks of one communicator on the same GPU ('Duplicate GPU detected'), so the "
    "trainer and vLLM need a GPU each: rerun on a machine with 2 GPUs with --vllm-gpu 0 --trainer-gpu 1 "
    "(REFERENCE §1.1 'Placement'). On one GPU, vLLM's 'ipc' weight-transfer backend is the colocated option."
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=_Formatter
    )
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="hub id or local path, served and trained")
    parser.add_argument("--syncs", type=int, default=10, help="number of weight syncs to time")
    parser.add_argument("--check", action="store_true", help="check that synced weights change sampling logprobs")
    parser.add_argument("--timeout-s", type=float, default=480.0, help="limit for the whole run")
    parser.add_argument("--vllm-gpu", type=int, default=0, help="GPU index (among the visible ones) for vLLM")
    parser.add_argument(
        "--trainer-gpu",
        type=int,
        default=None,
        help="GPU index for the trainer; None: 1 if 2+ GPUs are visible, else 0",
    )
    parser.add_argument("--port", type=int, default=0, help="vLLM port (0: a free one)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tool-call-parser", default="hermes", help="Qwen3 speaks hermes-style <tool_call>")
    parser.add_argument("--cuda-graphs", action="store_true", help="let vLLM capture CUDA graphs (slower start)")
    parser.add_argument("--sync-timeout-s", type=float, default=120.0, help="limit for one transfer")
    parser.add_argument("--log-file", default=None, help="vLLM's output; None: vllm_serve.log in $OUT or /tmp")
    parser.add_argument("--json-out", default=None, help="also write the RESULT json here")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra `vllm serve` argument (repeat)")
    args = parser.parse_args(argv)
    if args.syncs < 1:
        parser.error("--syncs must be >= 1")
    if args.log_file is None:
        args.log_file = str(Path(os.environ.get("OUT") or "/tmp") / "vllm_serve.log")
    return args


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


# ----- pure helpers (tested on CPU) ---------------------------------------------------------------


def vllm_command(args: argparse.Namespace, port: int, launcher: Sequence[str] = ("vllm",)) -> list[str]:
    """The ``vllm serve`` command line (``launcher``: how to run the ``vllm`` CLI)."""
    command = [*launcher, "serve", args.model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    command += ["--max-model-len", str(args.max_model_len), "--dtype", args.dtype]
    command += ["--logprobs-mode", "processed_logprobs", "--return-tokens-as-token-ids"]
    command += ["--enable-auto-tool-choice", "--tool-call-parser", args.tool_call_parser]
    if not args.cuda_graphs:
        command.append("--enforce-eager")
    return command + list(args.vllm_arg)


def vllm_env(gpu: int, environ: Mapping[str, str]) -> dict[str, str]:
    """vLLM's environment: dev-mode routes on, and only GPU ``gpu`` (of this process's visible ones) visible."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else None
    if devices is not None and not 0 <= gpu < len(devices):
        raise ValueError(f"--vllm-gpu {gpu} is not among CUDA_VISIBLE_DEVICES={visible}")
    return {**environ, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": devices[gpu] if devices else str(gpu)}


def summarize(times: Sequence[float]) -> dict[str, Any]:
    """First (cold) sync, then median and p90 (nearest rank) of the warm ones (all of them if only one)."""
    if not times:
        return {"syncs": 0}
    warm = list(times[1:]) or list(times)
    ordered = sorted(warm)
    return {
        "syncs": len(times),
        "first_s": round(times[0], 4),
        "median_s": round(statistics.median(warm), 4),
        "p90_s": round(ordered[math.ceil(0.9 * len(ordered)) - 1], 4),
        "all_s": [round(t, 4) for t in times],
    }


def init_failure_message(error: BaseException, same_gpu: bool, log_tail: str) -> tuple[int, str]:
    """Exit code and explanation for a failed NCCL init."""
    duplicate = "duplicate gpu" in (str(error) + log_tail).lower()
    if same_gpu or duplicate:
        return EXIT_SAME_GPU, f"NCCL weight-transfer init failed with vLLM and the trainer on one GPU: {error}. "
    return EXIT_FAILED, f"NCCL weight-transfer init failed: {error}"


def tail(path: str, lines: int = 40) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as handle:
        return "".join(handle.readlines()[-lines:])
    return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(url: str, body: Any = None, timeout_s: float = 60.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


# ----- the run ------------------------------------------------------------------------------------


class Run:
    """State shared with the watchdog: the vLLM process and the result so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.deadline = self.start + args.timeout_s
        self.server: subprocess.Popen | None = None
        self.result: dict[str, Any] = {"ok": False, "model": args.model, "error": None}
        self._reported = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:7.1f}s] {message}", flush=True)

    def stop_server(self) -> None:
        server, self.server = self.server, None
        if server is None or server.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)

    def report(self) -> None:
        if not self._reported.acquire(blocking=False):
            return
        self.result["elapsed_s"] = round(time.monotonic() - self.start, 1)
        line = json.dumps(self.result)
        print("RESULT " + line, flush=True)
        if self.args.json_out:
            Path(self.args.json_out).write_text(line + "\n")

    def on_deadline(self) -> None:
        self.result["error"] = f"time limit of {self.args.timeout_s}s reached"
        self.log(self.result["error"] + "; stopping vLLM")
        self.stop_server()
        self.report()
        os._exit(EXIT_TIMEOUT)


def start_vllm(run: Run, port: int) -> None:
    import shutil

    executable = shutil.which("vllm")
    launcher = [executable] if executable else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    command = vllm_command(run.args, port, launcher)
    env = vllm_env(run.args.vllm_gpu, os.environ)
    run.result["vllm_command"] = " ".join(command)
    run.log(f"starting: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {' '.join(command)}")
    Path(run.args.log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(run.args.log_file, "w") as log:
        run.server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(run: Run, url: str) -> None:
    while True:
        if run.server is None or run.server.poll() is not None:
            raise RuntimeError(f"vllm serve exited before it was healthy:\n{tail(run.args.log_file)}")
        if run.left() < 30:
            raise TimeoutError(f"vllm serve not healthy with {run.left():.0f}s left:\n{tail(run.args.log_file)}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError, ValueError),
            urllib.request.urlopen(url + "/health", timeout=5) as response,
        ):
            if response.status == 200:
                return
        time.sleep(1.0)


def engine_logprobs(url: str, model: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """Greedy token ids and their logprobs from ``/v1/completions`` (token-id prompt, REFERENCE §1.2)."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": 8, "temperature": 0, "logprobs": 0}
    body["return_token_ids"] = True
    choice = http_json(url + "/v1/completions", body)["choices"][0]
    logprobs = choice["logprobs"]
    ids = choice.get("token_ids") or [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    return ids, [float(x) for x in logprobs["token_logprobs"]]


def check_logprobs(run: Run, url: str, sync: Any, model: Any, tokenizer: Any) -> dict[str, Any]:
    """Perturb, sync, compare; restore, sync, compare. Raises AssertionError with the numbers on failure."""
    import torch

    prompt_ids = tokenizer(CHECK_PROMPT, add_special_tokens=False)["input_ids"]
    base_ids, base = engine_logprobs(url, run.args.model, prompt_ids)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
            param.add_((0.1 * param.float().std() * noise).to(param.dtype))
    sync.sync(model)
    moved_ids, moved = engine_logprobs(url, run.args.model, prompt_ids)
    with torch.no_grad():
        ids = torch.tensor([prompt_ids + moved_ids], device=next(model.parameters()).device)
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        trainer = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt_ids) :, None]).squeeze(1).tolist()
        for name, param in model.named_parameters():
            param.copy_(original[name])
    sync.sync(model)
    back_ids, back = engine_logprobs(url, run.args.model, prompt_ids)
    prefix = next((i for i, (a, b) in enumerate(zip(base_ids, moved_ids, strict=False)) if a != b), len(base_ids))
    out = {
        "tokens_changed": moved_ids != base_ids,
        "logprob_change_max": max((abs(a - b) for a, b in zip(base[:prefix], moved[:prefix], strict=False)), default=0),
        "engine_vs_trainer_max": max(abs(a - b) for a, b in zip(moved, trainer, strict=True)),
        "restored_tokens_equal": back_ids == base_ids,
        "restored_logprob_diff_max": max(abs(a - b) for a, b in zip(base, back, strict=False)),
    }
    run.log(f"check: {out}")
    assert out["tokens_changed"] or out["logprob_change_max"] > 1e-2, f"perturbed weights did not show: {out}"
    assert out["engine_vs_trainer_max"] < 0.25, f"the engine's logprobs are not the trainer's: {out}"
    assert out["restored_tokens_equal"] and out["restored_logprob_diff_max"] < 1e-2, f"restore failed: {out}"
    return out


def run_bench(args: argparse.Namespace) -> int:
    run = Run(args)
    watchdog = threading.Timer(args.timeout_s, run.on_deadline)
    watchdog.daemon = True
    watchdog.start()
    try:
        return _run_bench(run)
    except Exception as exc:
        run.result["error"] = run.result["error"] or f"{type(exc).__name__}: {exc}"
        run.log(f"failed: {run.result['error']}")
        return EXIT_FAILED
    finally:
        watchdog.cancel()
        run.stop_server()
        run.report()


def _run_bench(run: Run) -> int:
    import importlib.util

    import torch

    args = run.args
    if not torch.cuda.is_available():
        run.result["error"] = "no CUDA device: this check needs a GPU"
        return EXIT_UNAVAILABLE
    if importlib.util.find_spec("vllm") is None:
        run.result["error"] = "vLLM is not installed: pip install 'harness-grpo[vllm]' (vllm>=0.22,<0.26)"
        return EXIT_UNAVAILABLE
    from importlib.metadata import version

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness_grpo.weight_transports import NCCLTransport, VLLMNCCLWeightSync, WeightSyncError

    count = torch.cuda.device_count()
    trainer_gpu = args.trainer_gpu if args.trainer_gpu is not None else (1 if count > 1 else 0)
    same_gpu = trainer_gpu == args.vllm_gpu
    run.result.update(vllm=version("vllm"), torch=torch.__version__, gpus=count, same_gpu=same_gpu)
    run.result.update(vllm_gpu=args.vllm_gpu, trainer_gpu=trainer_gpu)
    if same_gpu:
        run.log(f"vLLM and the trainer share GPU {trainer_gpu}; NCCL is expected to refuse that. {SAME_GPU_HINT}")

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    start_vllm(run, port)
    device = torch.device("cuda", trainer_gpu)
    torch.cuda.set_device(device)
    run.log(f"loading {args.model} on {device} while vLLM starts")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(device).eval()
    wait_healthy(run, url)
    run.log(f"vLLM healthy at {url}")

    sync = VLLMNCCLWeightSync(
        url,
        transport=NCCLTransport(device),
        timeout_s=60,
        init_timeout_s=max(30.0, min(60.0 if same_gpu else 180.0, run.left() - 60)),
        transfer_timeout_s=args.sync_timeout_s,
        cleanup_timeout_s=10,
    )
    try:
        t0 = time.perf_counter()
        try:
            sync.init(model)
        except WeightSyncError as exc:
            code, message = init_failure_message(exc, same_gpu, tail(args.log_file, 80))
            run.result["error"] = message + (SAME_GPU_HINT if code == EXIT_SAME_GPU else "")
            run.log(run.result["error"] + "\nvLLM log tail:\n" + tail(args.log_file))
            return code
        run.result["init_s"] = round(time.perf_counter() - t0, 3)
        run.log(f"weight-transfer group formed in {run.result['init_s']}s ({sync.engine_world_size} vLLM worker(s))")

        times: list[float] = []
        for _ in range(args.syncs):
            if run.left() < args.sync_timeout_s + (60 if args.check else 15):
                run.log("stopping the syncs early to stay inside the time limit")
                break
            t0 = time.perf_counter()
            sync.sync(model)
            times.append(time.perf_counter() - t0)
        run.result["sync"] = summarize(times)
        run.log(f"weight sync seconds: {run.result['sync']}")
        if args.check:
            run.result["check"] = check_logprobs(run, url, sync, model, tokenizer)
        run.result["ok"] = True
        return EXIT_OK
    finally:
        sync.close()


def main(argv: Sequence[str] | None = None) -> int:
    return run_bench(parse_args(argv))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A daemon thread may still be blocked in NCCL after a failure; don't let interpreter teardown wait on it.
    os._exit(code)
