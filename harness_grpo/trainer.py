"""``HarnessAsyncGRPOTrainer``: async GRPO on exactly the tokens black-box agents sampled.

Processes and threads: the trainer (main thread) optimises; a service thread runs one asyncio loop
with the services (``harness_grpo.services``: the engine unless an engine URL is given, the capture
proxy when the session factory uses the trainer's) and the ``RolloutProducer``, whose sessions
block on worker threads. Sessions reach the model only through a capture proxy.

The session factory is built once, at construction, as TRL builds it:
``harness_session_factory(sampling=policy)`` (``harness_grpo.session_protocol``); the trainer then
calls ``factory.create(row["prompt"], seed=..., episode_id=...)`` per rollout, or, for its own
trainer-bound factories, ``bind_rollout(context)`` once and ``create_from_row(row, ...)``. With
``environment_factory`` or ``tools`` instead, the trainer's own factory runs the built-in tool loop
(``harness_grpo.tool_loop``) through the same proxy.

A step: take ``groups_per_step`` complete groups (dropping groups more than ``max_staleness``
policy versions old, counted); score the rollouts (``harness_grpo.reward_funcs``: ``reward_funcs``,
environments' ``get_reward``, ``rollout_reward_fn(outcome)`` or by default the verifier's
``env_reward``; a rollout that failed to run is None, i.e. unscorable); group advantages
with None excluded; rows from each scored rollout's trace along the capture graph the proxy built
(``sequences_from_trace`` → ``rollout_rows``); pack; clipped surrogate + token IS; one optimizer
step; every ``weight_sync_steps`` push the weights to the engine and bump the policy version.

The loop is transformers' ``Trainer`` loop where it can be: ``TrainingArguments`` settings are
checked and turned into the optimizer, schedule, precision and checkpointing by
``harness_grpo.training_args`` (which lists what is honoured and refuses the rest); the state is a
``TrainerState``; ``CallbackHandler`` fires every ``TrainerCallback`` event the loop has
(``on_init_end``, ``on_train_begin``, ``on_epoch_begin``/``on_epoch_end`` per pass over the
dataset, ``on_step_begin``, ``on_substep_end`` after each micro-batch but the last,
``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``, ``on_log``, ``on_save``,
``on_push_begin``, ``on_train_end``); ``DefaultFlowCallback`` and user callbacks decide through
``TrainerControl`` when to log, save and stop (rank 0's decision holds on every rank). Metrics go
to ``report_to`` through transformers' reporting callbacks and to a rich progress line;
checkpoints (``harness_grpo.checkpoints``) hold model, optimizer, scheduler, RNG, dataset position
and policy version; ``push_to_hub`` pushes them and the final model (``harness_grpo.hub``).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import AutoTokenizer, PreTrainedModel, TrainerCallback
from transformers.integrations import get_reporting_integration_callbacks
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback, TrainerControl
from transformers.utils import logging as hf_logging

from harness_grpo.advantages import group_metrics, step_advantages, step_turn_advantages
from harness_grpo.checkpoints import HarnessTrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from harness_grpo.completion_log import log_episodes
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.distributed import (
    broadcast_from_main,
    filler_row,
    gather_to_all,
    loss_scale,
    max_over_ranks,
    shard_rows,
)
from harness_grpo.engine.embedded import resolve_model
from harness_grpo.environments import EnvironmentFactory, Environments
from harness_grpo.hub import HubPusher
from harness_grpo.loss import LossConfig, grpo_loss, merge_metrics, token_logprobs
from harness_grpo.model_loading import load_causal_lm
from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.packing import pack_rows
from harness_grpo.reward_funcs import RewardFunc, RewardFunctions, TurnRewards
from harness_grpo.rollout_context import RolloutContext
from harness_grpo.rollout_func import RolloutFunc, rollout_func_factory
from harness_grpo.rollout_log import ROLLOUT_LOG, append_rollouts
from harness_grpo.rollout_metrics import outcome_metrics, reward_metrics
from harness_grpo.rollouts import RolloutGroup, RolloutProducer
from harness_grpo.rows import Row, RowStats, call_spans, loss_normalizer, rollout_rows
from harness_grpo.services import TrainerServices
from harness_grpo.session_protocol import TrainerBoundSessionFactory, check_factory
from harness_grpo.tool_loop import ToolLoopSessionFactory
from harness_grpo.training_args import (
    accelerator_kwargs,
    check_training_args,
    create_optimizer,
    create_scheduler,
    enable_activation_checkpointing,
    seed_everything,
)
from harness_grpo.weight_transports import WeightSync
from harness_grpo.white_box import HarnessAdapter, WhiteBoxSessionFactory
from proxy.capture_graph import sequences_from_trace

console = Console(soft_wrap=True)  # log lines stay whole in files and CI logs

RewardFn = Callable[[HarnessRolloutOutcome], float | None]
__all__ = ["HarnessAsyncGRPOTrainer", "RewardFn", "latest_checkpoint"]


def _progress_bar(disable: bool) -> Progress:
    """Steps done of ``max_steps`` with the last reward and policy version; per-step lines print above it."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=disable,
    )


class HarnessAsyncGRPOTrainer:
    """Async GRPO for loop-owning agents (see the module docstring).

    ``model``: a hub id or path (``"tiny"``/``"tiny-warm"``: the embedded default), or a loaded model.
    ``harness_session_factory``: called once as ``harness_session_factory(sampling=policy)``; what it
    returns has ``create(prompt, seed=..., episode_id=...)`` (``harness_grpo.session_protocol``), e.g.
    OpenEnv's ``HarborSessionFactory`` or ``functools.partial(LocalAgentSessionFactory, command=[...],
    verifier=...)``. Not given with ``environment_factory`` / ``tools``.
    ``args``: ``HarnessGRPOConfig``. ``train_dataset``: rows with a ``prompt`` (a string or a message
    list); other columns reach trainer-bound factories, environments' ``reset`` and reward functions.
    Rows are walked in order, ``num_train_epochs`` times when ``max_steps`` is not set.
    ``rollout_reward_fn``: ``HarnessRolloutOutcome -> float | None``; default: the verifier's ``env_reward``.
    ``harness_adapter``: None for loop-owning agents; else the white-box tool loop that runs each
    rollout through the proxy (``harness_grpo.white_box``), the factory's sessions being its environment.
    ``reward_funcs``: TRL's reward functions, one or a list, weighted by ``args.reward_weights``; with a
    session factory they add to its verifier reward (``harness_grpo.reward_funcs``).
    ``environment_factory`` (a class or callable, or a dict of them keyed by the rows' ``environment``)
    and ``tools`` (functions): the built-in tool loop, TRL's ``environment_factory`` contract
    (``harness_grpo.environments``, ``harness_grpo.tool_loop``); rewards come from ``reward_funcs``,
    environments' ``get_reward`` or ``rollout_reward_fn``.
    ``processing_class``: the tokenizer (default: the model's). ``callbacks``: ``TrainerCallback``s
    (classes or instances), after transformers' ``DefaultFlowCallback`` and the ``report_to`` ones.
    ``weight_sync``: the weight transport (``harness_grpo.weight_transports``); default: in-process to the
    embedded engine, or chosen from the engine at ``vllm_server_base_url``.
    ``rollout_func``: TRL's ``rollout_func(prompts, trainer) -> dict``, instead of a session factory: it owns
    generation (through the trainer's proxy) and the environment (``harness_grpo.rollout_func``).

    Several processes (``accelerate launch`` with FSDP2 or DDP, or ``torchrun``): rank 0 runs the
    services and rollouts and broadcasts each step's rows; every rank trains on its share and takes
    part in each weight sync (``harness_grpo.distributed``).
    """

    def __init__(
        self,
        model: str | PreTrainedModel,
        harness_session_factory: Callable[..., Any] | None = None,
        args: HarnessGRPOConfig | None = None,
        train_dataset: Sequence[dict[str, Any]] | None = None,
        rollout_reward_fn: RewardFn | None = None,
        harness_adapter: HarnessAdapter | None = None,
        *,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        environment_factory: EnvironmentFactory | dict[str, EnvironmentFactory] | None = None,
        tools: list[Callable[..., Any]] | None = None,
        processing_class: Any = None,
        callbacks: list[TrainerCallback | type[TrainerCallback]] | None = None,
        weight_sync: WeightSync | None = None,
        rollout_func: RolloutFunc | None = None,
    ) -> None:
        if isinstance(harness_session_factory, HarnessGRPOConfig):
            raise TypeError(
                "the second positional argument is harness_session_factory; pass args=..., train_dataset=... by keyword"
            )
        if args is None:
            name = model if isinstance(model, str) else getattr(model, "name_or_path", "model")
            args = HarnessGRPOConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-HarnessGRPO")
        check_training_args(args)  # again: args may have changed since their construction
        if train_dataset is None or len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: it needs one row per task, each with a 'prompt'")
        self.args = args
        seed_everything(args)
        hf_logging.set_verbosity(args.get_process_log_level())
        if harness_adapter is not None and not isinstance(harness_adapter, HarnessAdapter):
            raise TypeError(f"harness_adapter {type(harness_adapter).__name__} has no run_white_box method")
        if weight_sync is not None and not isinstance(weight_sync, WeightSync):
            missing = [name for name in ("version", "sync", "close") if not hasattr(weight_sync, name)]
            raise TypeError(
                f"weight_sync {type(weight_sync).__name__} is not a WeightSync: missing {', '.join(missing)}"
            )
        self.sampling = args.sampling_policy()
        if rollout_func is not None:
            if environment_factory is not None or tools:
                raise ValueError(
                    "rollout_func owns generation and the environment: it cannot be combined with "
                    "environment_factory or tools"
                )
            self.environments = None
            factory = rollout_func_factory(
                rollout_func,
                self,
                harness_session_factory=harness_session_factory,
                harness_adapter=harness_adapter,
                needs_env_reward=rollout_reward_fn is None and not reward_funcs,
            )
            if "prompt" not in train_dataset[0]:
                raise ValueError("train_dataset rows need a 'prompt' column: rollout_func gets the rows' prompts")
        else:
            self.environments = _environments(harness_session_factory, harness_adapter, environment_factory, tools)
            if self.environments is not None:
                self.environments.check_rows(train_dataset)
                factory = None  # built once the tokenizer is loaded: the tool loop counts tokens with it
            else:
                factory = harness_session_factory(sampling=dict(self.sampling))
                check_factory(factory, harness_session_factory)
        if harness_adapter is not None and rollout_func is None:
            factory = WhiteBoxSessionFactory(
                factory,
                harness_adapter,
                max_turns=args.max_tool_calling_iterations or 8,
                chat_template_kwargs=args.chat_template_kwargs,
            )
        self.session_factory = factory
        self.harness_adapter = harness_adapter
        self.uses_own_proxy = factory is None or isinstance(factory, TrainerBoundSessionFactory)
        if not self.uses_own_proxy and "prompt" not in train_dataset[0]:
            raise ValueError("train_dataset rows need a 'prompt' column: the session factory creates from it")
        self.train_dataset = train_dataset
        self.rewards = RewardFunctions(
            reward_funcs, args.reward_weights, rollout_reward_fn=rollout_reward_fn, environments=self.environments
        )
        self.max_steps = (
            args.max_steps
            if args.max_steps > 0
            else math.ceil(args.num_train_epochs * len(train_dataset) / args.groups_per_step)
        )
        if isinstance(model, str):
            self.model_path, _ = resolve_model(model)
            self.model = load_causal_lm(self.model_path, torch.float32)
        else:
            self.model = model
            self.model_path = getattr(model, "name_or_path", None)
        self.tokenizer = processing_class or AutoTokenizer.from_pretrained(self.model_path)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if self.environments is not None:
            self.session_factory = ToolLoopSessionFactory(
                self.environments,
                tokenizer=self.tokenizer,
                max_tool_calling_iterations=args.max_tool_calling_iterations,
                max_completion_length=args.max_completion_length,
                chat_template_kwargs=args.chat_template_kwargs,
            )
        # Under `accelerate launch` / torchrun this joins the process group and applies the launch's
        # FSDP2 / DDP settings; in one process it only picks the device.
        self.accelerator = Accelerator(**accelerator_kwargs(args))
        self.device = self.accelerator.device
        self.is_main = self.accelerator.is_main_process
        enable_activation_checkpointing(args, self.model)
        optimizer = create_optimizer(args, self.model)
        self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)
        # Not prepared: accelerate would step a prepared scheduler once per process.
        self.lr_scheduler = create_scheduler(args, optimizer, self.max_steps)
        self.accelerator.register_for_checkpointing(self.lr_scheduler)
        self.loss_config = LossConfig(
            epsilon=args.epsilon,
            epsilon_high=args.epsilon_high,
            importance_sampling=args.importance_sampling,
            is_cap=args.importance_sampling_cap,
            is_floor=args.vllm_importance_sampling_clip_min,
            beta=args.beta,
            top_entropy_quantile=args.top_entropy_quantile,
        )
        self.reference = None
        if args.beta > 0:
            self.reference = load_causal_lm(self.model_path, torch.float32).eval()
            self.reference.requires_grad_(False).to(self.device)
        self.state = HarnessTrainerState(
            max_steps=self.max_steps,
            num_train_epochs=math.ceil(self.max_steps * args.groups_per_step / len(train_dataset)),
            is_world_process_zero=self.is_main,
            is_local_process_zero=self.accelerator.is_local_main_process,
        )
        self.state.compute_steps(args, self.max_steps)
        self.control = TrainerControl()
        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback, *get_reporting_integration_callbacks(args.report_to), *(callbacks or [])],
            self.model,
            self.tokenizer,
            self.optimizer,
            self.lr_scheduler,
        )
        self.hub = HubPusher(args) if args.push_to_hub and self.is_main else None
        self.injected_weight_sync = weight_sync
        self.services: TrainerServices | None = None
        self._last_logged_step = self._last_saved_step = -1
        self._episodes_to_log: tuple[list[RolloutGroup], list[list[float | None]]] | None = None
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)

    @property
    def weight_sync(self) -> WeightSync | None:
        return self.services.weight_sync if self.services is not None else None

    def _start_services(self) -> None:
        """Engine, proxy and weight sync (``harness_grpo.services``); binds a trainer-bound factory to the proxy."""
        args = self.args
        self.services = TrainerServices.start(
            args,
            model_path=self.model_path,
            is_main=self.is_main,
            needs_proxy=self.uses_own_proxy,
            policy_version=self.state.policy_version,
            weight_sync=self.injected_weight_sync,
        )
        if self.is_main and self.uses_own_proxy:
            assert self.services.proxy_endpoint is not None
            self.session_factory.bind_rollout(
                RolloutContext(
                    proxy=self.services.proxy_endpoint,
                    sampling=dict(self.sampling),
                    max_model_calls=args.max_model_calls,
                    max_output_tokens=args.max_completion_length,
                )
            )

    def _stop_services(self) -> None:
        if self.services is not None:
            self.services.stop()

    def _start_producer(self) -> RolloutProducer:
        """Rank 0: the rollout producer, producing on the service loop from the dataset position on."""
        args = self.args
        assert self.services is not None and self.services.loop is not None
        producer = RolloutProducer(
            self.session_factory,
            self.train_dataset,
            num_generations=args.num_generations,
            max_concurrent_rollouts=args.max_concurrent_rollouts,
            max_groups_ahead=max(args.groups_per_step * 2, args.max_concurrent_rollouts // args.num_generations),
            rollout_timeout_s=args.rollout_timeout_s,
            policy_version=lambda: self.state.policy_version,
            start_position=self.state.dataset_position,
            seed=args.seed,
            roles=args.train_roles,
            sampling=self.sampling,
        )
        producer.start(self.services.loop.loop)
        return producer

    # --- training -------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        """Run to ``max_steps`` (or until a callback stops it); returns the last step's metrics (rank 0; others {}).

        ``resume_from_checkpoint``: a checkpoint path, or True (or ``"true"``) for the last one in
        ``output_dir``; default: ``args.resume_from_checkpoint``."""
        args = self.args
        checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
        if checkpoint is not None:
            load_checkpoint(self, checkpoint)
            if args.ignore_data_skip:  # restart the current pass over the dataset, as Trainer restarts its epoch
                self.state.dataset_position -= self.state.dataset_position % len(self.train_dataset)
            if self.is_main:
                console.print(f"resumed from {checkpoint} at step {self.state.global_step}")
        torch_threads = torch.get_num_threads()
        if self.device.type == "cpu" and args.vllm_server_base_url is None:
            torch.set_num_threads(1)  # the embedded engine, proxy and agents share these cores (restored at the end)
        producer = None
        last: dict[str, float] = {}
        self._dropped_before = self.state.dropped_groups
        self._progress = _progress_bar(disable=args.disable_tqdm or not self.is_main)
        self._progress_task = self._progress.add_task(
            "training", total=self.max_steps, completed=self.state.global_step, status=""
        )
        try:
            self._start_services()
            if self.hub is not None:
                self.hub.create_repo()
            self._progress.start()
            # A fresh engine holds the base weights, an engine server an earlier run used holds that run's:
            # either way, give it this run's before any rollout starts.
            engine_version = self.services.engine_weight_version() if self.is_main else None
            other_weights = engine_version is not None and engine_version != self.state.policy_version
            if broadcast_from_main(checkpoint is not None or other_weights):
                self.state.policy_version = self.weight_sync.sync(self.model)
            self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
            producer = self._start_producer() if self.is_main else None
            epoch, epoch_open = int(self.state.epoch), False
            metrics: dict[str, float] = {}
            while self.state.global_step < self.max_steps and not self.control.should_training_stop:
                if not epoch_open:
                    self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
                    epoch_open = True
                self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                metrics = self._step(producer)
                last = metrics if self.is_main else {}
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                self._log_and_save(metrics)
                while int(self.state.epoch) > epoch:  # the step finished a pass over the dataset (or several)
                    if not epoch_open:
                        self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
                    self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
                    self._log_and_save(metrics)
                    epoch, epoch_open = epoch + 1, False
            if epoch_open:  # stopped inside a pass: it ends here, as in Trainer
                self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
                self._log_and_save(metrics)
            self.control = self.callback_handler.on_train_end(args, self.state, self.control)
            if args.push_to_hub:
                self.save_model()
                if self.hub is not None:
                    self.callback_handler.on_push_begin(args, self.state, self.control)
                    self.hub.push_final()
        finally:
            self._progress.stop()
            if producer is not None:
                producer.stop()
            self._stop_services()
            torch.set_num_threads(torch_threads)
        return last

    def _checkpoint_to_resume(self, resume: str | bool | None) -> Path | None:
        """The checkpoint ``train(resume_from_checkpoint=...)`` or ``args.resume_from_checkpoint`` names."""
        if resume is None:
            resume = self.args.resume_from_checkpoint
        if isinstance(resume, str) and resume.lower() in ("true", "false"):  # from the command line
            resume = resume.lower() == "true"
        if resume is True:
            found = latest_checkpoint(self.args.output_dir)
            if found is None:
                raise ValueError(f"resume_from_checkpoint=True: no checkpoint in {self.args.output_dir}")
            return found
        return Path(resume) if resume else None

    def _step(self, producer: RolloutProducer | None) -> dict[str, float]:
        """One training step on every rank: rank 0 takes groups and builds rows, all ranks optimise, weights sync."""
        args = self.args
        started = time.monotonic()
        shared = None
        if producer is not None:
            groups = producer.take(
                args.groups_per_step,
                current_version=self.state.policy_version,
                max_staleness=args.max_staleness,
                timeout_s=args.rollout_timeout_s * 2 + 60,
            )
            self.state.dropped_groups = self._dropped_before + producer.dropped_stale
            rewards, columns, logged, turn_rewards = self.rewards.score(groups, self.state)  # each function: once
            rows, metrics = self._rows_and_metrics(groups, rewards, turn_rewards)
            metrics.update(reward_metrics(columns))
            metrics.update(logged)
            if args.save_rollouts:
                append_rollouts(Path(args.output_dir) / ROLLOUT_LOG, self.state.global_step + 1, groups, rewards)
            if args.log_completions:
                self._episodes_to_log = (groups, rewards)  # printed and reported if this step is logged
            shared = (rows, metrics, max(g.row_index for g in groups) + 1, self.state.dropped_groups)
        rows, metrics, self.state.dataset_position, self.state.dropped_groups = broadcast_from_main(shared)
        metrics.update(self._optimize(rows))
        self.state.global_step += 1
        self.state.epoch = self.state.dataset_position / len(self.train_dataset)
        if self.state.global_step % args.weight_sync_steps == 0:
            sync_started = time.monotonic()
            self.state.policy_version = self.weight_sync.sync(self.model)
            metrics["weight_sync_time_s"] = time.monotonic() - sync_started
        metrics["policy_version"] = float(self.state.policy_version)
        metrics["step_time_s"] = time.monotonic() - started
        self._progress.update(
            self._progress_task,
            completed=self.state.global_step,
            status=f"reward {metrics.get('reward', float('nan')):.3f} v{self.state.policy_version}",
        )
        return metrics

    def _log_and_save(self, metrics: dict[str, float]) -> None:
        """Log and save as ``self.control`` says (rank 0's flags hold on every rank), each at most once a step."""
        control = self.control
        control.should_log, control.should_save, control.should_training_stop = broadcast_from_main(
            (control.should_log, control.should_save, control.should_training_stop)
        )
        step = self.state.global_step
        if control.should_log and self._last_logged_step != step:
            self._log(metrics)
        if control.should_save and self._last_saved_step != step:
            self._save()
        self.control.should_log = self.control.should_save = False

    def _rows_and_metrics(
        self,
        groups: list[RolloutGroup],
        scores: list[list[float | None]],
        turn_rewards: list[list[TurnRewards]] | None = None,
    ) -> tuple[list[Row], dict[str, float]]:
        """Rank 0: the groups' advantages (``scores[i]``: group i's rewards; ``turn_rewards[i]``: their per-turn
        rewards, see ``harness_grpo.reward_funcs``), the step's rows, the rollout metrics (those of each reward
        column come from ``_step``)."""
        args = self.args
        now = time.monotonic()
        rewards: list[float | None] = []
        group_stats = []
        rows: list[Row] = []
        row_stats = RowStats()
        advantaged = step_advantages(scores, baseline=args.advantage_baseline, scale=args.scale_rewards)
        turn_rewards = turn_rewards or [[None] * len(group) for group in scores]
        turn_advantages = step_turn_advantages(
            turn_rewards, scores, baseline=args.advantage_baseline, scale=args.scale_rewards
        )
        for group, group_rewards, (advantages, stats), group_turns in zip(
            groups, scores, advantaged, turn_advantages, strict=True
        ):
            group_stats.append((group_rewards, stats))
            rewards += group_rewards
            for index, (outcome, reward, advantage, turns) in enumerate(
                zip(group.outcomes, group_rewards, advantages, group_turns, strict=True)
            ):
                if reward is None:
                    continue
                rows += rollout_rows(
                    sequences_from_trace(outcome.training_trace),
                    advantage,
                    policy_version=group.policy_version,
                    rollout_id=f"{group.group_id}-{index}",
                    group_id=group.group_id,
                    include_roles=args.train_roles,
                    max_length=min(args.max_sequence_length, args.max_tokens_per_microbatch),
                    weighting=args.loss_weighting,
                    stats=row_stats,
                    turn_advantages=None if turns is None else call_spans(outcome.trace, turns),
                )
        metrics = {
            **outcome_metrics([g.outcomes for g in groups], rewards, shaped=self.rewards.shaped, reward_columns={}),
            **group_metrics(group_stats),
            **row_stats.metrics(),
            "staleness/mean": float(np.mean([self.state.policy_version - g.policy_version for g in groups])),
            "staleness/dropped_groups": float(self.state.dropped_groups),
            "queue_wait_time_s": float(np.mean([now - g.finished_at for g in groups])),
            "rollout/group_time_s": float(np.mean([g.finished_at - g.started_at for g in groups])),
        }
        return rows, metrics

    def _optimize(self, rows: list[Row]) -> dict[str, float]:
        """Every rank: one optimizer step on its share of ``rows`` (see ``harness_grpo.distributed``).

        Callbacks see ``on_substep_end`` after each micro-batch's backward but the last, then, after
        clipping to ``max_grad_norm`` (0: none; ``grad_norm`` is the norm before clipping),
        ``on_pre_optimizer_step`` and ``on_optimizer_step``. A step without signal (no row with an
        advantage, and no KL term) runs no backward and no optimizer step; the schedule still advances.
        """
        args = self.args
        # Zero-advantage rows contribute nothing without a KL term; they still count in the normalizer.
        active = [r for r in rows if r.has_signal] if args.beta == 0 else rows
        metrics: dict[str, float] = {"learning_rate": self.lr_scheduler.get_last_lr()[0]}
        if not active:  # the same rows on every rank: all skip together
            with warnings.catch_warnings():  # the schedule follows global steps, skipped ones included
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
                self.lr_scheduler.step()
            metrics["skipped_no_signal"] = 1.0
            return metrics
        started = time.monotonic()
        normalizer = loss_normalizer(rows)
        mine = shard_rows(active, self.accelerator.process_index, self.accelerator.num_processes)
        packing = pack_rows(mine, args.max_tokens_per_microbatch, pad_token_id=self.pad_token_id)
        batches = list(packing.microbatches)
        filler = pack_rows([filler_row(self.pad_token_id)], 2, pad_token_id=self.pad_token_id).microbatches[0]
        batches += [filler] * (max_over_ranks(len(batches)) - len(batches))
        scale = loss_scale()
        self.model.train()
        parts = []
        total_loss = 0.0
        for index, batch in enumerate(batches):
            logprobs, entropy = token_logprobs(self.model, batch, args.temperature)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = token_logprobs(self.reference, batch, args.temperature)
            loss, part = grpo_loss(
                logprobs, batch, normalizer=normalizer, config=self.loss_config, ref_logprobs=ref, entropy=entropy
            )
            self.accelerator.backward(loss * scale)
            total_loss += float(loss.detach())
            if batch is not filler:
                parts.append(part)
            if index < len(batches) - 1:
                self.control = self.callback_handler.on_substep_end(args, self.state, self.control)
        max_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else math.inf
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        self.control = self.callback_handler.on_pre_optimizer_step(args, self.state, self.control)
        self.optimizer.step()
        self.control = self.callback_handler.on_optimizer_step(args, self.state, self.control)
        if not self.accelerator.optimizer_step_was_skipped:  # an fp16 overflow skips both, as in Trainer
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.monotonic() - started
        by_rank = gather_to_all((parts, total_loss, packing.real_tokens, packing.computed_tokens, packing.metrics()))
        parts = [part for rank_parts, *_ in by_rank for part in rank_parts]
        real_tokens = sum(tokens for _, _, tokens, _, _ in by_rank)
        computed_tokens = sum(tokens for *_, tokens, _ in by_rank)  # padding included
        self.state.num_input_tokens_seen += (
            computed_tokens if args.include_num_input_tokens_seen == "all" else real_tokens
        )
        metrics.update(merge_metrics(parts))
        metrics.update(packing.metrics() if len(by_rank) == 1 else _mean_dicts([m for *_, m in by_rank]))
        metrics.update(
            {
                "loss": sum(loss for _, loss, *_ in by_rank),
                "grad_norm": float(grad_norm),
                "tokens_per_s": real_tokens / elapsed if elapsed > 0 else 0.0,
                "trained_tokens": float(sum(r.n_trainable for r in active)),
                "optimize_time_s": elapsed,
            }
        )
        return metrics

    # --- logging and checkpoints -----------------------------------------------------------------------------------

    def _log(self, metrics: dict[str, float]) -> None:
        """The step's metrics (with ``epoch``, and ``num_input_tokens_seen`` when asked) to the log history,
        ``on_log`` (reporting callbacks) and, on rank 0, the console."""
        logs = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}
        logs["epoch"] = round(self.state.epoch, 6)
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
        self._last_logged_step = self.state.global_step
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)
        if not self.is_main:
            return
        reward = metrics.get("reward", float("nan"))
        correct = metrics.get("rollout/correctness_mean")
        self._progress.console.print(
            f"[bold]step {self.state.global_step}/{self.max_steps}[/] reward {reward:.3f} "
            + (f"correct {correct:.3f} " if correct is not None else "")
            + f"unscorable {metrics.get('rollout/unscorable_frac', 0.0):.2f} "
            f"tools/call {metrics.get('tools/call_frequency', 0.0):.2f} "
            f"loss {metrics.get('loss', float('nan')):.4f} v{self.state.policy_version} "
            f"{metrics.get('step_time_s', 0.0):.1f}s"
        )
        if self._episodes_to_log is not None:
            groups, rewards = self._episodes_to_log
            self._episodes_to_log = None
            log_episodes(
                groups,
                rewards,
                step=self.state.global_step,
                scale_rewards=self.args.scale_rewards,
                baseline=self.args.advantage_baseline,
                console=self._progress.console,
                limit=self.args.num_completions_to_print,
                report_to=self.args.report_to,
                callbacks=self.callback_handler.callbacks,
                output_dir=Path(self.args.output_dir),
            )

    def _save(self) -> None:
        """Every rank: write this step's checkpoint; rank 0 pushes it by ``hub_strategy``; then ``on_save``."""
        path = save_checkpoint(self)
        self._last_saved_step = self.state.global_step
        if self.hub is not None:
            self.callback_handler.on_push_begin(self.args, self.state, self.control)
            self.hub.push_checkpoint(path, step=self.state.global_step, epoch=self.state.epoch)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def save_model(self, output_dir: str | Path | None = None) -> None:
        """Every rank: save the model and tokenizer, loadable by ``from_pretrained``, in ``output_dir``
        (default ``args.output_dir``); rank 0 writes (the weights are gathered first under FSDP2)."""
        target = Path(output_dir if output_dir is not None else self.args.output_dir)
        state_dict = self.accelerator.get_state_dict(self.model)
        if self.is_main:
            self.accelerator.unwrap_model(self.model).save_pretrained(target, state_dict=state_dict)
            self.tokenizer.save_pretrained(target)
        self.accelerator.wait_for_everyone()


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for d in dicts for k in d}
    return {k: float(np.mean([d[k] for d in dicts if k in d])) for k in keys}


def _environments(
    harness_session_factory: Any,
    harness_adapter: Any,
    environment_factory: EnvironmentFactory | dict[str, EnvironmentFactory] | None,
    tools: list[Callable[..., Any]] | None,
) -> Environments | None:
    """The built-in tool loop's environments when ``environment_factory`` or ``tools`` is given (probed now,
    so a bad tool fails the construction); None for a session factory. Refuses a mix of the two modes."""
    if environment_factory is None and not tools:
        if harness_session_factory is None:
            raise TypeError(
                "HarnessAsyncGRPOTrainer needs harness_session_factory (an agent runs each rollout), "
                "environment_factory= / tools= (the built-in tool loop runs it) or rollout_func= (your function does)"
            )
        return None
    if harness_session_factory is not None or harness_adapter is not None:
        given = "harness_session_factory" if harness_session_factory is not None else "harness_adapter"
        raise ValueError(
            f"{given} and environment_factory/tools are two ways to run rollouts: pass one (reward functions go "
            "in reward_funcs=, by keyword)"
        )
    return Environments(environment_factory, tools)
