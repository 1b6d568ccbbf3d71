# /// script
# requires-python = ">=3.12"
# dependencies = [
#     "torch>=2.9,<=2.14.1",
#     "transformers>=5.24,<6",
#     "tokenizers>=0.22",
#     "accelerate>=1.10",
#     "datasets>=4",
#     "huggingface_hub>=1.0",
#     "pydantic>=2.10,<3",
#     "aiohttp>=3.11,<4",
#     "orjson>=3.10",
#     "uvloop>=0.21; sys_platform != 'win32'",
#     "filelock>=3.12",
#     "rich>=13",
#     "harbor==0.25.0",
#     "openenv==0.10.0",
#     "pyyaml>=6",
# ]
# ///
"""Train a model with async GRPO on a black-box agent harness: the main job.

    .venv/bin/python launchers/train.py                      # CPU default, see below
    .venv/bin/python launchers/train.py --max_steps 50 --report_to tensorboard
    .venv/bin/python launchers/train.py --resume             # continue from the last checkpoint
    .venv/bin/torchrun --nproc_per_node 2 launchers/train.py # two data-parallel ranks (CPU: DDP over gloo)
    uv run launchers/train.py                                # no venv: uv reads the PEP 723 header above

Every ``HarnessGRPOConfig`` field is a flag (``--learning_rate``, ``--num_generations``,
``--vllm_server_base_url`` ...). The defaults are the embedded CPU run: the tiny model after
the submit task's short SFT (built from files this repo ships, cached), the embedded engine and
the capture proxy in-process on loopback, and ``examples/agents/tool_agent.py`` as the harness:
its own process per rollout, owning its loop, talking only HTTP to the proxy. The reward is
``examples/rewards.py``'s ``correctness_with_efficiency``: the task verifier's look at the agent's
working directory, plus a small bonus for solving it in few tool calls. On 2 cores the default 20 steps take a
few minutes and lift the verifier's reward from about 0.3 (see ``tests/trainer/test_learning.py``).

Several processes: rank 0 runs the engine, the proxy and the rollouts, and every rank trains on its
share of each step's rows (``harness_grpo.distributed``). On GPUs, FSDP2 through accelerate, with a
vLLM server started separately (``bench/vllm_weight_sync_gpu.py`` shows its flags)::

    accelerate launch --num_processes 4 --use_fsdp --fsdp_version 2 \
        --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Qwen3DecoderLayer \
        --fsdp_state_dict_type FULL_STATE_DICT --mixed_precision bf16 \
        launchers/train.py --model Qwen/Qwen3-0.6B --vllm_server_base_url http://127.0.0.1:8000

``--harness`` names the loop-owning agent: ``tool-agent`` (above), or a Harbor harness: a coding-agent
CLI installed by ``launchers/install_agents.sh`` (``opencode``, ``codex``, ``claude-code``,
``mini-swe-agent``), Harbor's ``terminus-2``, or any Harbor agent name or ``module:Class`` import path.
Each rollout of a Harbor harness is one Harbor trial (``harness_grpo.harbor_sessions``) of a task from
``--dataset`` (default ``examples/tasks``; also a Harbor registry dataset or ``hf://owner/name``) in
``--sandbox`` (default ``local``: isolated on this machine, no Docker; or docker, e2b, modal, daytona
with ``--proxy_url``), scored by the task's verifier; ``--difficulty easy`` keeps the tasks whose ``task.toml``
says so. With the tiny model the CLI is configured as for any small model (``SMALL_MODEL_PROMPT``: a short system
prompt, its shell tool only). For mini-swe-agent, opencode and codex the tiny policy is the warm
model after the shell-chore SFT on the dataset's instructions (``harness_grpo.tiny_model.shell_sft``: the CLI's
own request and shell tool, and a repertoire of commands drawn uniformly, so on the easy tasks about one rollout
in seven is rewarded from the first step and GRPO has to learn which command each task asks for;
``SHELL_CHORE_DEFAULTS``; the README has what it learns)::

    .venv/bin/python launchers/train.py --harness mini-swe-agent --difficulty easy   # a real CLI, rewarded from step 1
    .venv/bin/python launchers/train.py --harness opencode --difficulty easy --max_steps 10
    .venv/bin/python launchers/train.py --config run.yaml   # any flags above as YAML keys

Before anything loads, a missing prerequisite (the agent CLI, the sandbox's tools or credentials, a
dataset that names no task) ends the run with exit status 2 and one line each saying what to do; so
does an engine that does not return exact token ids and processed logprobs, once the proxy probed it.
``--save_rollouts true`` appends every trained rollout and its trace to ``output_dir/rollouts.jsonl``.

``--env_url`` trains on a running rollout service instead: ``openenv harbor serve`` or ours (``python -m
harness_grpo.serve``), which owns the tasks, the sandboxes and the capture proxy, possibly on another machine. Each
rollout is one ``run_rollout`` of ``--harness`` in ``--sandbox`` on a task of ``--split`` (the service's dataset;
``--n_tasks``/``--task_indices`` select tasks), its agent calling the engine at ``--vllm_server_base_url``, which the
trainer syncs its weights into (so the service must reach that URL too)::

    .venv/bin/python -m harness_grpo.engine --model tiny-warm --port 8000 &
    .venv/bin/python -m harness_grpo.serve --dataset examples/tasks --llm-url http://127.0.0.1:8000 \
        --port 8200 --capture-port 8300 &
    .venv/bin/python launchers/train.py --env_url http://127.0.0.1:8200 --split examples/tasks \
        --harness terminus-2 --vllm_server_base_url http://127.0.0.1:8000
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

from examples import submit_task  # noqa: E402
from examples.rewards import correctness_with_efficiency  # noqa: E402
from harness_grpo.agent_sessions import LocalAgentSessionFactory  # noqa: E402
from harness_grpo.agents import AGENTS, SMALL_MODEL_PROMPT  # noqa: E402
from harness_grpo.checkpoints import latest_checkpoint  # noqa: E402
from harness_grpo.config import HarnessGRPOConfig  # noqa: E402
from harness_grpo.harbor_sessions import HarborTrialSessionFactory, missing_prerequisites  # noqa: E402
from harness_grpo.harbor_tasks import TaskDatasetError, load_task_dataset  # noqa: E402
from harness_grpo.services import ServicesError  # noqa: E402
from harness_grpo.tiny_model.shell_sft import SHELL_CHORE_AGENTS, shell_chore_model  # noqa: E402
from harness_grpo.trainer import HarnessAsyncGRPOTrainer  # noqa: E402

HARNESSES = ("tool-agent", *AGENTS, "terminus-2")
"""The named harnesses; any other Harbor agent name or ``module:Class`` import path is a Harbor harness too."""
TASKS = REPO / "examples" / "tasks"

CPU_DEFAULTS = {
    "output_dir": str(REPO / "runs" / "train-tiny"),
    "max_steps": 20,
    "learning_rate": 2e-4,  # tests/trainer/test_learning.py: at 3e-4, 2 of 11 runs lost the tool-call format
    "loss_weighting": "rollout",
    "lr_scheduler_type": "constant",
    "num_generations": 8,
    "groups_per_step": 2,
    "max_staleness": 1,
    "temperature": 1.0,
    "max_completion_length": 64,
    "max_model_calls": 2,
    "rollout_timeout_s": 120.0,
    "logging_steps": 1,
    "save_steps": 5,
    "save_total_limit": 2,
    "report_to": "none",
}


CLI_DEFAULTS = {
    "num_generations": 4,
    "groups_per_step": 1,
    "max_staleness": 2,
    "temperature": 0.5,
    "max_completion_length": 128,
    "max_model_calls": 4,
    "rollout_timeout_s": 300.0,
}
"""Overrides of ``CPU_DEFAULTS`` for the coding-agent CLIs: fewer, longer rollouts."""

SHELL_CHORE_DEFAULTS = {
    "num_generations": 8,
    "groups_per_step": 4,
    "max_concurrent_rollouts": 8,
    "temperature": 1.0,
    "max_model_calls": 2,
    "learning_rate": 3e-4,
    "beta": 0.1,
    "advantage_baseline": "batch",
    "max_steps": 30,
}
"""Overrides of ``CLI_DEFAULTS`` for a CLI on the tiny model after the shell-chore SFT (no ``--model``, no
``--vllm_server_base_url``): two model calls (the command, then the submit or the answer; opencode's title call
takes the second), sampled as the SFT left them, 32 trials a step; the KL term
keeps the names the SFT copies, the batch baseline trains the tasks a step fails every time (``bench/cli_learning.py``,
README)."""


@dataclass
class LaunchArgs:
    """What to train and on which harness (the trainer's own settings are ``HarnessGRPOConfig``'s)."""

    harness: str = field(
        default="tool-agent",
        metadata={"help": f"The agent harness: {', '.join(HARNESSES)}, or a Harbor agent name or module:Class."},
    )
    sandbox: str = field(
        default="local",
        metadata={
            "help": "Where each Harbor trial runs: local (isolated on this machine), docker, e2b, modal, daytona "
            "(any Harbor environment type) or a module:Class import path."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Harbor tasks: a directory of tasks or one task, a Harbor registry dataset (name[@version]) or "
            "hf://owner/name; default examples/tasks. (tool-agent has its own built-in task.)"
        },
    )
    difficulty: str | None = field(
        default=None,
        metadata={"help": "Train on the tasks whose task.toml says [metadata] difficulty = this (e.g. easy)."},
    )
    reward_key: str = field(default="reward", metadata={"help": "The verifier's reward.json key used as reward."})
    proxy_url: str | None = field(
        default=None,
        metadata={"help": "The capture proxy as a remote sandbox reaches it (required for all but local)."},
    )
    model: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or path of the policy; default: tool-agent: the tiny model after the task SFT; "
            "mini-swe-agent, opencode, codex: the tiny model after the shell-chore SFT on the dataset's "
            "instructions; other Harbor harnesses: the warm-started tiny model (both with SMALL_MODEL_PROMPT)."
        },
    )
    env_url: str | None = field(
        default=None,
        metadata={
            "help": "A running rollout service (openenv harbor serve, or python -m harness_grpo.serve) to run the "
            "rollouts on: its env server URL. Needs --vllm_server_base_url, the engine its agents call."
        },
    )
    split: str = field(
        default="", metadata={"help": "With --env_url: the service's dataset to train on; default its first."}
    )
    n_tasks: int | None = field(default=None, metadata={"help": "With --env_url: train on the first N tasks only."})
    task_indices: str | None = field(
        default=None, metadata={"help": "With --env_url: train on these tasks only, as comma-separated indices."}
    )
    resume: bool = field(default=False, metadata={"help": "Resume from the last checkpoint in output_dir."})
    window: int = field(default=5, metadata={"help": "Steps averaged for the first/last reward summary."})


def config_file_values(path: Path, known: set[str]) -> dict[str, Any]:
    """The settings of a ``--config`` YAML file: a mapping of flag names (without ``--``) to values.

    ``ValueError`` names the file and what is wrong: unreadable YAML, not a mapping, or a key that is no flag.
    """
    try:
        values = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"--config {path}: {error}") from error
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of flag names to values, got {type(values).__name__}")
    unknown = sorted(str(key) for key in values if key not in known)
    if unknown:
        raise ValueError(f"--config {path}: unknown settings {', '.join(unknown)} (see --help for the flags)")
    return values


def parse(argv: list[str] | None = None) -> tuple[LaunchArgs, HarnessGRPOConfig]:
    """Flags over the ``--config`` file over the harness's defaults over ``CPU_DEFAULTS``, through one parser."""
    parser = HfArgumentParser((LaunchArgs, HarnessGRPOConfig))
    parser.add_argument("--config", type=Path, help="YAML file of settings (flag names as keys); flags override it.")
    parser.set_defaults(**CPU_DEFAULTS)
    known, _ = parser.parse_known_args(args=argv)
    from_file: dict[str, Any] = {}
    if known.config is not None:
        try:
            settings = {f.name for dataclass_type in (LaunchArgs, HarnessGRPOConfig) for f in fields(dataclass_type)}
            from_file = config_file_values(known.config, settings)
        except ValueError as error:
            parser.error(str(error))
    harness = from_file.get("harness", known.harness)
    if harness != "tool-agent":
        name = harness.rpartition(":")[2].lower()
        parser.set_defaults(**CLI_DEFAULTS, output_dir=str(REPO / "runs" / f"train-{name}"))
    model = from_file.get("model", known.model)
    if trains_shell_chore_model(harness, model, from_file.get("vllm_server_base_url", known.vllm_server_base_url)):
        parser.set_defaults(**SHELL_CHORE_DEFAULTS)
    parser.set_defaults(**from_file)
    launch, config, _ = parser.parse_args_into_dataclasses(args=argv)
    if launch.harness == "tool-agent" and launch.dataset is not None:
        parser.error("--dataset is for Harbor harnesses; tool-agent trains on its built-in task")
    if launch.harness == "tool-agent" and launch.difficulty is not None:
        parser.error("--difficulty selects Harbor tasks; tool-agent trains on its built-in task")
    if launch.env_url is not None:
        if launch.harness == "tool-agent":
            parser.error("--env_url runs Harbor harnesses: pass --harness (terminus-2, opencode, ...)")
        for name in ("dataset", "difficulty", "proxy_url"):
            if getattr(launch, name) is not None:
                parser.error(f"--{name} is the rollout service's with --env_url (its tasks are --split's)")
        if config.vllm_server_base_url is None:
            parser.error(
                "--env_url needs --vllm_server_base_url: the engine the service's agents call and the trainer "
                "syncs its weights into (e.g. python -m harness_grpo.engine --model tiny-warm --port 8000)"
            )
    elif launch.split or launch.n_tasks is not None or launch.task_indices is not None:
        parser.error("--split, --n_tasks and --task_indices select a rollout service's tasks: pass --env_url")
    return launch, config


def service_factory(launch: LaunchArgs, args: HarnessGRPOConfig) -> functools.partial:
    """``HarborSessionFactory`` on the rollout service at ``--env_url``, for the trainer to call with ``sampling=``."""
    from harness_grpo.harbor_service_sessions import HarborSessionFactory  # OpenEnv's client: loaded only here

    indices = None
    if launch.task_indices is not None:
        try:
            indices = [int(index) for index in launch.task_indices.split(",")]
        except ValueError:
            raise ValueError(f"--task_indices must be comma-separated integers, not {launch.task_indices!r}") from None
    return functools.partial(
        HarborSessionFactory,
        launch.env_url,
        split=launch.split,
        llm_url=args.vllm_server_base_url,
        harness=launch.harness,
        sandbox=launch.sandbox,
        reward_key=launch.reward_key,
        agent_timeout_sec=args.rollout_timeout_s,
        agent_step_limit=args.max_model_calls or 0,
        num_tasks=launch.n_tasks,
        indices=indices,
    )


def trains_shell_chore_model(harness: str, model: str | None, vllm_server_base_url: str | None) -> bool:
    """A CLI the shell-chore SFT knows, with no ``--model``, on the embedded engine: it trains the shell-chore SFT
    model, with ``SHELL_CHORE_DEFAULTS``."""
    return harness in SHELL_CHORE_AGENTS and model is None and vllm_server_base_url is None


def default_cli_model(harness: str, dataset: Dataset, args: HarnessGRPOConfig) -> str:
    """The tiny policy a Harbor harness trains without ``--model``: on the embedded engine, for the CLIs of
    ``SHELL_CHORE_AGENTS`` the warm model after that CLI's shell-chore SFT on the dataset's instructions
    (``harness_grpo.tiny_model.shell_sft``: its request and shell tool and a repertoire of commands, so the easy
    tasks give reward from the first step); else the warm model, which an engine of its own
    (``--vllm_server_base_url``) must serve."""
    if trains_shell_chore_model(harness, None, args.vllm_server_base_url):
        return str(shell_chore_model([row["prompt"][0]["content"] for row in dataset], harness))
    return "tiny-warm"


def main(argv: list[str] | None = None) -> int:
    launch, args = parse(argv)
    if launch.harness == "tool-agent":
        factory = functools.partial(
            LocalAgentSessionFactory,
            command=submit_task.agent_command(),
            verifier=submit_task.verifier,
            setup=submit_task.setup,
        )
        model, dataset = launch.model or str(submit_task.task_model_path()), submit_task.dataset()
    elif launch.env_url is not None:
        try:
            factory = service_factory(launch, args)
        except ValueError as error:
            print(f"cannot start: {error}", file=sys.stderr)
            return 2
        try:
            dataset = factory(sampling={}).prompt_rows()
        except Exception as error:  # the service unreachable or refusing: one line, before the model loads
            print(f"cannot start: the rollout service at {launch.env_url}: {error}", file=sys.stderr)
            return 2
        if not dataset:
            print(f"cannot start: the rollout service at {launch.env_url} has no task to train on", file=sys.stderr)
            return 2
        model = launch.model or "tiny-warm"
    else:
        problems = missing_prerequisites(launch.harness, launch.sandbox)
        if problems:
            print("cannot start:\n" + "\n".join(f"- {problem}" for problem in problems), file=sys.stderr)
            return 2
        try:
            dataset = load_task_dataset(launch.dataset or TASKS, difficulty=launch.difficulty)
            factory = functools.partial(
                HarborTrialSessionFactory,
                harness=launch.harness,
                sandbox=launch.sandbox,
                reward_key=launch.reward_key,
                proxy_url=launch.proxy_url,
                system_prompt=SMALL_MODEL_PROMPT if launch.model is None else None,
            )
            factory(sampling={})  # the harness and sandbox are checked here, before the model loads
        except (TaskDatasetError, ValueError) as error:
            print(f"cannot start: {error}", file=sys.stderr)
            return 2
        model = launch.model or default_cli_model(launch.harness, dataset, args)
    trainer = HarnessAsyncGRPOTrainer(model, factory, args, dataset, rollout_reward_fn=correctness_with_efficiency)
    resume = latest_checkpoint(args.output_dir) if launch.resume else None
    if launch.resume and resume is None:
        print(f"no checkpoint under {args.output_dir}: starting from step 0")
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except ServicesError as error:
        print(f"cannot start: {error}", file=sys.stderr)
        return 2
    if not trainer.is_main:
        return 0
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.output_dir) / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    curve = [entry["rollout/correctness_mean"] for entry in trainer.state.log_history]
    if curve:
        first, last = statistics.mean(curve[: launch.window]), statistics.mean(curve[-launch.window :])
        print(
            f"verifier reward: first {min(launch.window, len(curve))} steps {first:.3f} -> "
            f"last {min(launch.window, len(curve))} steps {last:.3f} over {len(curve)} logged steps"
        )
    checkpoint = latest_checkpoint(args.output_dir)
    print(f"done at step {trainer.state.global_step}; last checkpoint: {checkpoint or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
