"""The processes of one training job on one machine (what ``launchers/job_entry.py`` runs inside a Hugging Face Job).

``run_job(plan)``, under one ``ProcessSupervisor`` (every child in its own process group, all killed on exit, on a
signal, or when one of them fails):

1. the engine on ``engine_gpus``: ``vllm serve`` with the flags exact capture and NCCL weight sync need
   (REFERENCE §1.1: processed logprobs, token ids, the NCCL weight transfer, ``VLLM_SERVER_DEV_MODE=1``), or the
   embedded CPU engine (``engine="embedded"``, same HTTP contract);
2. the rollout side, when ``rollout_command`` is given (e.g. ``openenv harbor serve ...``), on no GPU; without it
   the trainer runs our Harbor sessions and the capture proxy in-process;
3. when the sandbox builds templates (``harness_grpo.sandbox_warmup.TEMPLATE_SANDBOXES``, e.g. e2b), the warm-up
   (``python -m harness_grpo.sandbox_warmup``), one template at a time, while the engine loads;
4. once the engine (and the rollout side) answer ``/health`` within their bounds and the warm-up succeeded: the
   trainer, ``launchers/train.py <train flags> --vllm_server_base_url <engine>`` on ``trainer_gpus`` (through
   ``accelerate launch`` when there are several).

The job's exit status is the trainer's; a child that exits early, or never answers, fails the job with its name and
its log's last lines. Checkpoints and the final model reach the Hub when the train flags say ``--push_to_hub true
--hub_model_id ...`` (``harness_grpo.hub``): the trainer pushes them itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness_grpo.supervisor import Child, ChildFailed, ProcessSupervisor

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO / "launchers" / "train.py"
ENGINES = ("vllm", "embedded")


@dataclass
class JobPlan:
    """What runs where in the job (module docstring); ``train_flags`` are ``launchers/train.py``'s flags."""

    train_flags: list[str]
    engine: str = "vllm"
    engine_gpus: str = "0"
    trainer_gpus: str = "1"
    engine_port: int = 8000
    engine_args: list[str] = field(default_factory=list)
    tool_call_parser: str = "hermes"
    rollout_command: list[str] | None = None
    rollout_health_url: str | None = None
    warm_templates: str = "auto"
    engine_timeout_s: float = 1800.0
    rollout_timeout_s: float = 600.0
    warm_timeout_s: float = 3600.0
    log_dir: Path = Path("job-logs")
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.warm_templates not in ("auto", "yes", "no"):
            raise ValueError(f"warm_templates must be auto, yes or no, not {self.warm_templates!r}")
        if (self.rollout_command is None) != (self.rollout_health_url is None):
            raise ValueError("rollout_command and rollout_health_url go together")
        if self.model is None:
            raise ValueError("the train flags must name the policy with --model: the engine serves it")

    @property
    def train_options(self) -> argparse.Namespace:
        """The train flags the job itself reads (``--model``, ``--sandbox``, ``--dataset``)."""
        parser = argparse.ArgumentParser(add_help=False)
        for name in ("--model", "--sandbox", "--dataset"):
            parser.add_argument(name, default=None)
        return parser.parse_known_args(self.train_flags)[0]

    @property
    def model(self) -> str | None:
        return self.train_options.model

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    def needs_warmup(self) -> bool:
        from harness_grpo.sandbox_warmup import TEMPLATE_SANDBOXES

        if self.warm_templates == "auto":
            return self.train_options.sandbox in TEMPLATE_SANDBOXES
        return self.warm_templates == "yes"

    def engine_command(self) -> list[str]:
        """``vllm serve`` (REFERENCE §1.1) or the embedded engine, on 127.0.0.1:``engine_port``."""
        model, port = str(self.model), str(self.engine_port)
        if self.engine == "embedded":
            command = [self.python, "-m", "harness_grpo.engine", "--model", model, "--host", "127.0.0.1"]
            return [*command, "--port", port, *self.engine_args]
        command = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", port]
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
        command += ["--logprobs-mode", "processed_logprobs", "--return-tokens-as-token-ids"]
        command += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return command + self.engine_args

    def warmup_command(self) -> list[str]:
        options = self.train_options
        dataset = options.dataset or str(REPO / "examples" / "tasks")
        command = [self.python, "-m", "harness_grpo.sandbox_warmup", "--dataset", dataset]
        return [*command, "--sandbox", str(options.sandbox), "--timeout_s", str(self.warm_timeout_s)]

    def trainer_command(self) -> list[str]:
        """``launchers/train.py`` with the train flags and the engine's URL; ``accelerate launch`` for several GPUs."""
        processes = len([gpu for gpu in self.trainer_gpus.split(",") if gpu.strip()])
        if processes > 1:
            launcher = [self.python, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
        else:
            launcher = [self.python]
        return [*launcher, str(TRAIN_SCRIPT), *self.train_flags, "--vllm_server_base_url", self.engine_url]


def child_env(base: Mapping[str, str], gpus: str, **extra: str) -> dict[str, str]:
    """``base`` with only ``gpus`` visible (empty: none) and the repository importable."""
    path = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    return {**base, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def run_job(plan: JobPlan, supervisor: ProcessSupervisor, *, environ: Mapping[str, str] | None = None) -> int:
    """Run the job's processes (module docstring) under ``supervisor``; the trainer's exit status.

    Raises ``ChildFailed`` when a child exits early or does not answer in time; the caller stops the supervisor.
    """
    environ = dict(os.environ if environ is None else environ)
    engine_env = child_env(environ, plan.engine_gpus, VLLM_SERVER_DEV_MODE="1")
    engine = supervisor.start("engine", plan.engine_command(), env=engine_env, cwd=REPO)
    waiting: list[Child] = [engine]
    rollout = None
    if plan.rollout_command is not None:
        rollout = supervisor.start("rollout", plan.rollout_command, env=child_env(environ, ""), cwd=REPO)
        waiting.append(rollout)
    warmup = None
    if plan.needs_warmup():
        warmup = supervisor.start("warmup", plan.warmup_command(), env=child_env(environ, ""), cwd=REPO)
    for child in (engine, rollout, warmup):
        if child is not None:
            _say(f"started {child.name} (pid {child.pgid}, its own process group), log {child.log_path}")
    _say(f"engine ({plan.engine}) on GPUs [{plan.engine_gpus}] at {plan.engine_url}, loading {plan.model}")
    seconds = supervisor.wait_healthy(engine, f"{plan.engine_url}/health", plan.engine_timeout_s, must_stay_up=waiting)
    _say(f"engine healthy after {seconds:.0f} s")
    if rollout is not None:
        assert plan.rollout_health_url is not None
        url, timeout_s = plan.rollout_health_url, plan.rollout_timeout_s
        seconds = supervisor.wait_healthy(rollout, url, timeout_s, must_stay_up=waiting)
        _say(f"rollout side healthy after {seconds:.0f} s")
    if warmup is not None:
        code = supervisor.wait_for(warmup, must_stay_up=waiting)
        if code != 0:
            raise ChildFailed(f"the sandbox template warm-up failed (exit {code}):\n{warmup.log_tail()}")
        _say("sandbox templates ready")
    trainer = supervisor.start("trainer", plan.trainer_command(), env=child_env(environ, plan.trainer_gpus), cwd=REPO)
    _say(f"started trainer (pid {trainer.pgid}) on GPUs [{plan.trainer_gpus}], log {trainer.log_path}")
    code = supervisor.wait_for(trainer, must_stay_up=waiting)
    _say(f"trainer exited with {code}")
    if code != 0:
        _say(trainer.log_tail())
    return code


def _say(message: str) -> None:
    print(f"[job] {message}", flush=True)


def main_for(plan: JobPlan, *, stop_grace_s: float = 15.0) -> int:
    """The in-job entry: signal handlers on, ``run_job``, every child stopped whatever happens; the exit status."""
    supervisor = ProcessSupervisor(plan.log_dir, stop_grace_s=stop_grace_s)
    supervisor.install_signal_handlers()
    try:
        return run_job(plan, supervisor)
    except ChildFailed as error:
        _say(f"failed: {error}")
        return 1
    finally:
        supervisor.stop_all()


def plan_from_args(argv: Sequence[str]) -> JobPlan:
    """``launchers/job_entry.py``'s flags (before ``--``) and the train flags (after it) as a ``JobPlan``."""
    argv = list(argv)
    own, train_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="launchers/job_entry.py", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=ENGINES, default="vllm")
    parser.add_argument("--engine_gpus", default="0", help="CUDA_VISIBLE_DEVICES of the engine")
    parser.add_argument("--trainer_gpus", default="1", help="CUDA_VISIBLE_DEVICES of the trainer (a,b: accelerate)")
    parser.add_argument("--engine_port", type=int, default=8000)
    parser.add_argument("--engine_arg", action="append", default=[], help="one more engine flag (repeatable)")
    parser.add_argument("--tool_call_parser", default="hermes", help="vLLM's --tool-call-parser for the policy")
    parser.add_argument(
        "--rollout_command", default=None, help="the rollout side to start, e.g. 'openenv harbor serve'"
    )
    parser.add_argument("--rollout_health_url", default=None, help="where the rollout side answers 200 when ready")
    parser.add_argument("--warm_templates", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--engine_timeout_s", type=float, default=1800.0)
    parser.add_argument("--rollout_timeout_s", type=float, default=600.0)
    parser.add_argument("--warm_timeout_s", type=float, default=3600.0)
    parser.add_argument("--log_dir", type=Path, default=Path("job-logs"))
    args = parser.parse_args(own)
    try:
        return JobPlan(
            train_flags=train_flags,
            engine=args.engine,
            engine_gpus=args.engine_gpus,
            trainer_gpus=args.trainer_gpus,
            engine_port=args.engine_port,
            engine_args=args.engine_arg,
            tool_call_parser=args.tool_call_parser,
            rollout_command=None if args.rollout_command is None else shlex.split(args.rollout_command),
            rollout_health_url=args.rollout_health_url,
            warm_templates=args.warm_templates,
            engine_timeout_s=args.engine_timeout_s,
            rollout_timeout_s=args.rollout_timeout_s,
            warm_timeout_s=args.warm_timeout_s,
            log_dir=args.log_dir,
        )
    except ValueError as error:
        parser.error(str(error))
