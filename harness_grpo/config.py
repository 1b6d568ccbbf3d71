"""``HarnessGRPOConfig``: every trainer setting, documented once, here.

It extends ``transformers.TrainingArguments``, so ``output_dir``,
``learning_rate``, ``lr_scheduler_type``, ``max_steps``, ``logging_steps``,
``save_steps``, ``report_to``, ``seed``, ``optim``, ``bf16`` ... behave as in any
Hugging Face trainer and parse from flags or YAML through ``HfArgumentParser``.
A ``TrainingArguments`` setting the trainer does not honour (an eval loop,
``per_device_train_batch_size``, DeepSpeed ...) is refused here, at construction,
with a ``ValueError`` naming it: ``harness_grpo.training_args`` lists what is
honoured and how.

Defaults follow TRL's async GRPO where it has the same setting: ``learning_rate``
1e-6, a ``constant`` schedule (forks and dropped groups make the number of
samples per step unknowable), ``logging_steps`` 1, token-level loss weighting;
``logging_first_step`` is on and ``train_sampling_strategy`` is ``sequential``
(rows are walked in order).
``max_steps`` is optional: without it a run is ``num_train_epochs`` passes
over the dataset, ``ceil(epochs * rows / groups_per_step)`` steps.

Batch shape: one optimizer step consumes ``groups_per_step`` complete groups
of ``num_generations`` rollouts of one dataset row each. A rollout becomes one
or more rows (one per training sequence of its trace); rows are packed into
micro-batches of at most ``max_tokens_per_microbatch`` tokens, and gradients
accumulate over all of a step's micro-batches, so ``per_device_train_batch_size``
and ``gradient_accumulation_steps`` do not size steps (and are refused when set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import TrainingArguments

from harness_grpo.training_args import check_optim_name, check_training_args


@dataclass
class HarnessGRPOConfig(TrainingArguments):
    """Settings of ``HarnessAsyncGRPOTrainer`` (see the module docstring for the batch shape)."""

    _VALID_DICT_FIELDS: ClassVar[list[str]] = [*TrainingArguments._VALID_DICT_FIELDS, "chat_template_kwargs"]

    # --- TrainingArguments defaults that differ for async GRPO ------------------------------------------------------
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (TRL's async GRPO default)."})
    lr_scheduler_type: str = field(
        default="constant", metadata={"help": "Learning-rate schedule; constant by default (TRL's async GRPO)."}
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps."})
    logging_first_step: bool = field(
        default=True, metadata={"help": "Log the first step too: its reward is the baseline a run is read against."}
    )
    train_sampling_strategy: str = field(
        default="sequential",
        metadata={"help": "Rows are walked in dataset order; only 'sequential' (shuffle the dataset yourself)."},
    )

    # --- rollouts ---------------------------------------------------------------------------------------------------
    num_generations: int = field(default=8, metadata={"help": "Rollouts per dataset row (the GRPO group size)."})
    groups_per_step: int = field(default=1, metadata={"help": "Complete groups consumed per optimizer step."})
    max_concurrent_rollouts: int = field(
        default=-1,
        metadata={"help": "Agent sessions in flight at once; -1: num_generations * groups_per_step * 2."},
    )
    max_staleness: int = field(
        default=4,
        metadata={
            "help": "Drop a group whose policy version (stamped when its first rollout started) is more than this "
            "many weight syncs behind the trainer when consumed; queue time counts. 0: strictly on-policy."
        },
    )
    rollout_timeout_s: float = field(
        default=600.0,
        metadata={"help": "Wall-clock limit per agent session; a timed-out session keeps its tokens and reward."},
    )
    max_model_calls: int | None = field(
        default=None,
        metadata={"help": "Per-session model-call budget enforced by the proxy (None: unlimited)."},
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={
            "help": "Built-in tool loop (environment_factory / tools): rounds of tool calls per rollout, as in TRL's "
            "GRPO trainer (at most this + 1 model calls); None: no cap (max_completion_length still ends it). "
            "harness_adapter: model calls per rollout; None: 8."
        },
    )
    max_completion_length: int = field(
        default=2048,
        metadata={
            "help": "Agents (harness_session_factory, harness_adapter): most tokens sampled per model call (per "
            "turn, as in TRL AsyncGRPO), enforced by the proxy when the trainer runs it (a third-party session "
            "factory enforces its own). Built-in tool loop (environment_factory / tools): the whole conversation "
            "after the prompt, every model token and tool-result token across turns, as in TRL's GRPO trainer; "
            "the episode ends when it is spent."
        },
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of the chat template for the trainer's own model calls (built-in tool loop, "
            'harness_adapter), sent as the request\'s chat_template_kwargs, e.g. {"enable_thinking": false}; an '
            "agent sends its own. A JSON string on the command line."
        },
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Weight of each of reward_funcs, in order (default 1 each); environments' get_reward and "
            "rollout_reward_fn weigh 1. A rollout's reward is the weighted sum of its non-None rewards."
        },
    )
    max_sequence_length: int = field(
        default=32768,
        metadata={"help": "Training rows longer than this are dropped and counted, never cut."},
    )
    train_roles: tuple[str, ...] = field(
        default=("agent",),
        metadata={"help": "Capture-graph path roles that become training rows (agent, auxiliary, discarded)."},
    )

    # --- sampling (the policy every session pins) --------------------------------------------------------------------
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; the loss uses the same."})
    top_p: float = field(default=1.0, metadata={"help": "Must be 1.0: the loss assumes full-vocabulary samples."})
    top_k: int = field(default=-1, metadata={"help": "Must be -1 (or 0): the loss assumes full-vocabulary samples."})
    min_p: float = field(default=0.0, metadata={"help": "Must be 0.0: the loss assumes full-vocabulary samples."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Must be 1.0: no penalty the loss can't see."})

    # --- engine -----------------------------------------------------------------------------------------------------
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={"help": "A vLLM server (NCCL weight sync). None: the embedded CPU engine, in-process."},
    )
    engine_model: str | None = field(
        default=None,
        metadata={"help": "What the embedded engine loads; None: the trainer's model."},
    )
    engine_num_threads: int = field(default=1, metadata={"help": "torch threads of the embedded engine (0: all)."})
    proxy_host: str = field(
        default="127.0.0.1",
        metadata={"help": "Where the trainer's capture proxy listens; 0.0.0.0 for docker sandboxes to reach it."},
    )
    proxy_port: int = field(
        default=0, metadata={"help": "The capture proxy's port (0: any free one); fix it to put a tunnel in front."}
    )

    # --- loss -------------------------------------------------------------------------------------------------------
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range of the surrogate ratio."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip range; None: epsilon."})
    importance_sampling: str = field(
        default="token_tis",
        metadata={
            "help": "Correction of the trainer/engine mismatch: 'token_tis' (truncated weight), 'token_mask' "
            "(drop tokens outside [1/cap, cap]) or 'off'."
        },
    )
    importance_sampling_cap: float = field(default=2.0, metadata={"help": "Cap of the token IS weight."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the initial policy; 0: no reference."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide group advantages by the group's std."})
    loss_weighting: str = field(
        default="token",
        metadata={
            "help": "'token': every trainable token of the step weighs the same (GRPO's weighting, as TRL's async "
            "GRPO); 'rollout': each rollout's tokens are averaged first, so every rollout weighs the same however "
            "long it is and however many rows the capture split it into (harness_grpo.rows)."
        },
    )
    max_tokens_per_microbatch: int = field(default=16384, metadata={"help": "Token budget of one packed micro-batch."})

    # --- weight sync ------------------------------------------------------------------------------------------------
    weight_sync_steps: int = field(default=1, metadata={"help": "Push weights to the engine every N steps."})
    weight_sync_timeout_s: float = field(default=300.0, metadata={"help": "Limit of every wait in a weight sync."})

    # --- logging ----------------------------------------------------------------------------------------------------
    log_completions: bool = field(
        default=False, metadata={"help": "Print one rollout per step: verifier reward, tool calls, last completion."}
    )
    save_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Append every trained rollout (task, policy version, reward, its TrainingTrace) to "
            "output_dir/rollouts.jsonl (harness_grpo.rollout_log)."
        },
    )

    def __post_init__(self) -> None:
        # Without a GPU, TrainingArguments sets up accelerate's process state as a single process
        # unless use_cpu is set, which would leave every torchrun rank training alone.
        if not self.use_cpu and not torch.cuda.is_available():
            self.use_cpu = True
        # Before TrainingArguments' own checks and derived values, so that the error names what was set.
        check_optim_name(self.optim)
        check_training_args(self)
        super().__post_init__()
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2: GRPO compares rollouts of one task")
        if self.max_concurrent_rollouts == -1:
            self.max_concurrent_rollouts = self.num_generations * self.groups_per_step * 2
        if self.max_concurrent_rollouts < self.num_generations:
            raise ValueError("max_concurrent_rollouts must hold at least one group (num_generations)")
        if self.importance_sampling not in ("token_tis", "token_mask", "off"):
            raise ValueError("importance_sampling must be 'token_tis', 'token_mask' or 'off'")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if self.top_k == 0:
            self.top_k = -1
        neutral = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
        changed = {name: getattr(self, name) for name, value in neutral.items() if getattr(self, name) != value}
        if changed:
            raise ValueError(
                f"{changed}: training samples the full vocabulary (top_p=1, top_k=-1, min_p=0, repetition_penalty=1); "
                "a truncated or penalised distribution makes the engine's logprobs disagree with the loss"
            )
        if self.loss_weighting not in ("token", "rollout"):
            raise ValueError("loss_weighting must be 'token' or 'rollout'")
        self.train_roles = tuple(self.train_roles)

    def sampling_policy(self) -> dict[str, float | int]:
        """The policy handed to ``harness_session_factory(sampling=...)``: every session pins it."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }
