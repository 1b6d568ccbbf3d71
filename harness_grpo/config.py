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

TRL's own names (``GRPOConfig`` / ``AsyncGRPOConfig``, TRL 1.16) are fields too, so a TRL config
runs with its import changed: each either sets the same thing as ours (``use_vllm``/``vllm_mode``
choose the engine, ``vllm_importance_sampling_*`` the correction, ``generation_batch_size`` the step
size, ``max_inflight_tasks``, ``token_budget``, ``weight_sync_timeout``, ``loss_type="dapo"`` ...), or
is refused with a ``ValueError`` saying why when set to anything but TRL's default. Where one of
ours and TRL's name the same thing, either may be used; both set and disagreeing is an error.
``harness_grpo.trl_settings`` applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import TrainingArguments

from harness_grpo.advantages import BASELINES
from harness_grpo.training_args import check_optim_name, check_training_args
from harness_grpo.trl_settings import apply_trl_settings, trl_refused


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
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: the completions one generation round makes, here the rollouts one optimizer step "
            "trains on: groups_per_step = generation_batch_size / num_generations (it must divide, as in TRL)."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: only 1 (or None): every step trains on its own groups, produced while earlier "
            "steps trained; size steps with generation_batch_size."
        },
    )
    max_inflight_tasks: int = field(
        default=-1,
        metadata={"help": "TRL's name for max_concurrent_rollouts (-1: that field decides)."},
    )
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
    min_p: float | None = field(
        default=0.0,
        metadata={"help": "Must be 0.0 (or None, TRL's default): the loss assumes full-vocabulary samples."},
    )
    repetition_penalty: float = field(default=1.0, metadata={"help": "Must be 1.0: no penalty the loss can't see."})

    # --- engine -----------------------------------------------------------------------------------------------------
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={
            "help": "A vLLM server (NCCL weight sync). None: the embedded CPU engine, in-process, unless "
            "use_vllm=True and vllm_mode='server' name one by vllm_server_host/vllm_server_port."
        },
    )
    use_vllm: bool | None = field(
        default=None,
        metadata={
            "help": "TRL's name. None (auto): vLLM exactly when vllm_server_base_url is set. True: vLLM as vllm_mode "
            "says. False: the embedded engine (vllm_server_base_url must then be unset)."
        },
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "TRL's name, with use_vllm=True. 'server': the vLLM server at vllm_server_base_url, or else at "
            "http://<vllm_server_host>:<vllm_server_port> (TRL's defaults: http://localhost:8000). 'colocate': the "
            "engine inside the trainer process: on CPU the embedded engine (its analogue, and the default); on a "
            "GPU refused (vLLM in the trainer process is not built here: serve it apart and use 'server')."
        },
    )
    vllm_server_host: str = field(
        default="0.0.0.0",
        metadata={
            "help": "TRL's name: the vLLM server's host for vllm_mode='server' without a base URL (0.0.0.0: localhost)."
        },
    )
    vllm_server_port: int = field(
        default=8000, metadata={"help": "TRL's name: the vLLM server's port for vllm_mode='server' without a base URL."}
    )
    engine_model: str | None = field(
        default=None,
        metadata={"help": "What the embedded engine loads; None: the trainer's model."},
    )
    engine_num_threads: int = field(default=1, metadata={"help": "torch threads of the embedded engine (0: all)."})
    engine_enable_prefix_caching: bool = field(
        default=True,
        metadata={
            "help": "The embedded engine keeps finished calls' KV, so an agent's next call prefills only what it "
            "added (vLLM's enable_prefix_caching; dropped at every weight update)."
        },
    )
    proxy_host: str = field(
        default="127.0.0.1",
        metadata={"help": "Where the trainer's capture proxy listens; 0.0.0.0 for docker sandboxes to reach it."},
    )
    proxy_port: int = field(
        default=0, metadata={"help": "The capture proxy's port (0: any free one); fix it to put a tunnel in front."}
    )
    proxy_base_url: str | None = field(
        default=None,
        metadata={
            "help": "A capture proxy already running elsewhere (python -m proxy --engine-url <the engine at "
            "vllm_server_base_url>): the trainer opens its rollouts' sessions there instead of starting one. Its "
            "admin key comes from the environment variable HARNESS_PROXY_ADMIN_KEY (the one the proxy reads), "
            "never from a flag or a config file. Needs vllm_server_base_url."
        },
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
    vllm_importance_sampling_correction: bool | None = field(
        default=None,
        metadata={"help": "TRL's name. False: importance_sampling='off'. None or True: as the mode says."},
    )
    vllm_importance_sampling_mode: str | None = field(
        default=None,
        metadata={
            "help": "TRL's name for importance_sampling: 'token_truncate' (= token_tis: weight min(rho, clip_max), "
            "and max(., clip_min) when set) or 'token_mask' (weight 0 outside [clip_min, clip_max]; without clip_min "
            "only above clip_max, as TRL). The sequence modes are refused (a product over hundreds of tokens "
            "overflows). None (TRL's default is 'sequence_mask'): importance_sampling decides."
        },
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=None,
        metadata={
            "help": "TRL's name for importance_sampling_cap; None: importance_sampling_cap, or TRL's 3.0 when "
            "vllm_importance_sampling_mode is set. inf: no upper bound (TRL writes None)."
        },
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={
            "help": "TRL's name: the lower bound of the IS weight (token_tis: clipped up to it; token_mask: tokens "
            "below it get weight 0). None: none for token_tis and TRL's token_mask, 1/cap for our token_mask."
        },
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None,
        metadata={"help": "TRL's deprecated name for vllm_importance_sampling_clip_max."},
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the initial policy; 0: no reference."})
    top_entropy_quantile: float = field(
        default=1.0,
        metadata={
            "help": "TRL's name: keep in the policy loss only the trained tokens whose entropy (of the trainer's "
            "temperature-scaled distribution) is in the top quantile of the micro-batch's; the KL term keeps every "
            "token and the normalizer counts every token. 1.0: all; 0.2: the paper's (Beyond the 80/20 Rule)."
        },
    )
    scale_rewards: bool = field(
        default=True,
        metadata={
            "help": "Divide group advantages by the group's std. TRL's values: 'group' (True) and 'none' (False); "
            "'batch' is refused."
        },
    )
    advantage_baseline: str = field(
        default="group",
        metadata={
            "help": "'group': each group's own mean (GRPO); 'batch': one mean over the step's scored rollouts "
            "(REINFORCE++'s), so a task whose rollouts all failed while others succeeded is trained too "
            "(harness_grpo.advantages). scale_rewards divides by the same baseline's std."
        },
    )
    loss_weighting: str = field(
        default="token",
        metadata={
            "help": "'token': every trainable token of the step weighs the same (GRPO's weighting, as TRL's async "
            "GRPO); 'rollout': each rollout's tokens are averaged first, so every rollout weighs the same however "
            "long it is and however many rows the capture split it into (harness_grpo.rows)."
        },
    )
    max_tokens_per_microbatch: int = field(default=16384, metadata={"help": "Token budget of one packed micro-batch."})
    token_budget: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: > 0 sets max_tokens_per_microbatch; None: that field decides; <= 0 (TRL's "
            "fixed-count packing) is refused."
        },
    )
    loss_type: str | None = field(
        default=None,
        metadata={
            "help": "TRL's name: only 'dapo' (every trainable token of the step weighs the same, "
            "loss_weighting='token'); None: loss_weighting decides. The other TRL losses are refused."
        },
    )

    # --- weight sync ------------------------------------------------------------------------------------------------
    weight_sync_steps: int = field(default=1, metadata={"help": "Push weights to the engine every N steps."})
    weight_sync_timeout_s: float = field(default=300.0, metadata={"help": "Limit of every wait in a weight sync."})
    weight_sync_timeout: int | None = field(
        default=None, metadata={"help": "TRL's name for weight_sync_timeout_s (None: that field decides)."}
    )

    # --- logging ----------------------------------------------------------------------------------------------------
    log_completions: bool = field(
        default=False,
        metadata={
            "help": "TRL's name: every logged step, print whole episodes with rich (every turn, tool calls and tool "
            "results, reward, advantage), write them to output_dir/completions/completions_<step>.parquet and send "
            "them as a table to the report_to backends (wandb/trackio: a 'completions' table; tensorboard: a markdown "
            "text summary) (harness_grpo.completion_log)."
        },
    )
    num_completions_to_print: int | None = field(
        default=None,
        metadata={"help": "TRL's name: episodes printed per logged step with log_completions (None: all of them)."},
    )
    save_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Append every trained rollout (task, policy version, reward, its TrainingTrace) to "
            "output_dir/rollouts.jsonl (harness_grpo.rollout_log)."
        },
    )

    # --- TRL names refused unless at TRL's default (why: in each help; harness_grpo.trl_settings) ----------------
    model_init_kwargs: dict | str | None = trl_refused("model_init_kwargs")  # noqa: RUF009 (a field)
    dtype: str = trl_refused("dtype")
    trust_remote_code: bool = trl_refused("trust_remote_code")
    router_aux_loss_coef: float | None = trl_refused("router_aux_loss_coef")
    disable_dropout: bool = trl_refused("disable_dropout")
    cast_lm_head_to_fp32: bool = trl_refused("cast_lm_head_to_fp32")
    ds3_gather_for_generation: bool = trl_refused("ds3_gather_for_generation")
    num_generations_eval: int | None = trl_refused("num_generations_eval")
    shuffle_dataset: bool | None = trl_refused("shuffle_dataset")
    pad_to_multiple_of: int | str | None = trl_refused("pad_to_multiple_of")
    generation_kwargs: dict | str | None = trl_refused("generation_kwargs")  # noqa: RUF009 (a field)
    cache_implementation: str | None = trl_refused("cache_implementation")
    use_transformers_continuous_batching: bool = trl_refused("use_transformers_continuous_batching")
    transformers_continuous_batching_config: dict | str | None = trl_refused("transformers_continuous_batching_config")  # noqa: RUF009 (a field)
    use_transformers_paged: bool = trl_refused("use_transformers_paged")
    vllm_model_impl: str = trl_refused("vllm_model_impl")
    vllm_enable_sleep_mode: bool = trl_refused("vllm_enable_sleep_mode")
    vllm_gpu_memory_utilization: float = trl_refused("vllm_gpu_memory_utilization")
    vllm_max_model_length: int | None = trl_refused("vllm_max_model_length")
    vllm_tensor_parallel_size: int = trl_refused("vllm_tensor_parallel_size")
    vllm_structured_outputs_regex: str | None = trl_refused("vllm_structured_outputs_regex")
    vllm_group_port: int = trl_refused("vllm_group_port")
    vllm_server_timeout: float = trl_refused("vllm_server_timeout")
    request_timeout: int = trl_refused("request_timeout")
    queue_maxsize: int = trl_refused("queue_maxsize")
    heartbeat_stale_after_s: float = trl_refused("heartbeat_stale_after_s")
    fork_threshold_tokens: int = trl_refused("fork_threshold_tokens")
    num_iterations: int = trl_refused("num_iterations")
    importance_sampling_level: str = trl_refused("importance_sampling_level")
    delta: float | None = trl_refused("delta")
    sapo_temperature_neg: float = trl_refused("sapo_temperature_neg")
    sapo_temperature_pos: float = trl_refused("sapo_temperature_pos")
    vespo_k_pos: float = trl_refused("vespo_k_pos")
    vespo_lambda_pos: float = trl_refused("vespo_lambda_pos")
    vespo_k_neg: float = trl_refused("vespo_k_neg")
    vespo_lambda_neg: float = trl_refused("vespo_lambda_neg")
    multi_objective_aggregation: str = trl_refused("multi_objective_aggregation")
    mask_truncated_completions: bool = trl_refused("mask_truncated_completions")
    sync_ref_model: bool = trl_refused("sync_ref_model")
    ref_model_mixup_alpha: float = trl_refused("ref_model_mixup_alpha")
    ref_model_sync_steps: int = trl_refused("ref_model_sync_steps")
    entropy_coef: float = trl_refused("entropy_coef")
    use_adaptive_entropy: bool = trl_refused("use_adaptive_entropy")
    entropy_coef_min: float = trl_refused("entropy_coef_min")
    entropy_coef_max: float = trl_refused("entropy_coef_max")
    entropy_coef_delta: float = trl_refused("entropy_coef_delta")
    entropy_target: float = trl_refused("entropy_target")
    off_policy_mask_threshold: float | None = trl_refused("off_policy_mask_threshold")
    use_bias_correction_kl: bool | None = field(
        default=None,
        metadata={"help": "TRL's name: True is refused with beta > 0 (the KL term is not importance-weighted)."},
    )
    log_unique_prompts: bool = trl_refused("log_unique_prompts")
    log_completions_hub_repo: str | None = trl_refused("log_completions_hub_repo")
    log_multimodal: bool = field(
        default=True, metadata={"help": "TRL's name; harmless: there is no multimodal content."}
    )

    def __post_init__(self) -> None:
        # Without a GPU, TrainingArguments sets up accelerate's process state as a single process
        # unless use_cpu is set, which would leave every torchrun rank training alone.
        if not self.use_cpu and not torch.cuda.is_available():
            self.use_cpu = True
        # Before TrainingArguments' own checks and derived values, so that the error names what was set.
        check_optim_name(self.optim)
        check_training_args(self)
        apply_trl_settings(self, gpu=not self.use_cpu)
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
        if self.min_p is None:  # TRL's default
            self.min_p = 0.0
        neutral = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
        changed = {name: getattr(self, name) for name, value in neutral.items() if getattr(self, name) != value}
        if changed:
            raise ValueError(
                f"{changed}: training samples the full vocabulary (top_p=1, top_k=-1, min_p=0, repetition_penalty=1); "
                "a truncated or penalised distribution makes the engine's logprobs disagree with the loss"
            )
        if self.advantage_baseline not in BASELINES:
            raise ValueError(f"advantage_baseline must be one of {BASELINES}, not {self.advantage_baseline!r}")
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
