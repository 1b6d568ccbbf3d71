"""TRL's ``GRPOConfig`` / ``AsyncGRPOConfig`` names on ``HarnessGRPOConfig``: what each sets here, or why it is refused.

A TRL config copied over must either do what it did in TRL or fail at construction with a
``ValueError`` naming the setting and why (all problems at once). ``apply_trl_settings`` runs in
``HarnessGRPOConfig.__post_init__`` and writes each TRL name onto the field of ours that means the
same, so the rest of the trainer reads only ours:

- engine: ``use_vllm`` (None: vLLM exactly when ``vllm_server_base_url`` is set), ``vllm_mode``
  (``server``: ``vllm_server_base_url``, else ``http://<vllm_server_host>:<vllm_server_port>``, TRL's
  defaults giving ``http://localhost:8000``; ``colocate``: the engine in the trainer process, i.e.
  the embedded engine on CPU, refused on a GPU where it would mean vLLM in-process);
- importance sampling: ``vllm_importance_sampling_correction``/``_mode``/``_clip_max``/``_clip_min``
  (and the deprecated ``_cap``) onto ``importance_sampling``, ``importance_sampling_cap`` and the
  lower bound the loss reads from ``vllm_importance_sampling_clip_min``; a TRL mode without a
  ``clip_max`` takes TRL's default 3.0;
- step size: ``generation_batch_size`` onto ``groups_per_step`` (``steps_per_generation`` only 1);
- aliases: ``max_inflight_tasks`` (``max_concurrent_rollouts``), ``token_budget`` > 0
  (``max_tokens_per_microbatch``), ``weight_sync_timeout`` (``weight_sync_timeout_s``),
  ``loss_type="dapo"`` (``loss_weighting="token"``), ``scale_rewards`` ``"group"``/``"none"``;
- refused unless at TRL's default: every name in ``REFUSED``, with why (also in its field's help).

Where both names are set they must agree ("set" for ours means: not at its default, since a
dataclass cannot tell a default from the same value passed). The resolved config is consistent, so
building it again from its own ``to_dict()`` gives the same settings.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

_SEQUENCE_MODES = ("sequence_truncate", "sequence_mask")
_TRL_CLIP_MAX = 3.0  # TRL's vllm_importance_sampling_clip_max default

REFUSED: dict[str, tuple[Any, str, tuple[Any, ...]]] = {
    "model_init_kwargs": (
        None,
        "the model is loaded in float32 by from_pretrained; pass a loaded model to the trainer instead",
        (),
    ),
    "dtype": ("float32", "the trained model is float32 (for mixed precision set bf16=True)", ()),
    "trust_remote_code": (False, "pass a model (and processing_class) you loaded yourself", ()),
    "router_aux_loss_coef": (None, "no MoE auxiliary loss is added", ()),
    "disable_dropout": (False, "not wired in (set the model's dropout to 0 before passing it)", ()),
    "cast_lm_head_to_fp32": (False, "not wired in (the loss already takes logits in float32)", ()),
    "ds3_gather_for_generation": (True, "DeepSpeed is not supported", ()),
    "num_generations_eval": (None, "there is no evaluation loop", ()),
    "shuffle_dataset": (None, "rows are walked in dataset order; shuffle the dataset yourself", (False,)),
    "pad_to_multiple_of": (None, "rows are packed into micro-batches, not padded", ("auto",)),
    "generation_kwargs": (None, "the sampling policy is pinned (temperature only; full vocabulary)", ()),
    "cache_implementation": (None, "generation runs in the engine, not model.generate", ()),
    "use_transformers_continuous_batching": (False, "generation runs in the engine (embedded or vLLM)", ()),
    "transformers_continuous_batching_config": (None, "generation runs in the engine (embedded or vLLM)", ()),
    "use_transformers_paged": (False, "generation runs in the engine (embedded or vLLM)", ()),
    "vllm_model_impl": ("vllm", "a `vllm serve` flag here: the trainer never starts vLLM", ()),
    "vllm_enable_sleep_mode": (False, "a `vllm serve` flag here: the trainer never starts vLLM", ()),
    "vllm_gpu_memory_utilization": (0.3, "a `vllm serve` flag here (--gpu-memory-utilization)", ()),
    "vllm_max_model_length": (None, "a `vllm serve` flag here (--max-model-len)", ()),
    "vllm_tensor_parallel_size": (1, "a `vllm serve` flag here (--tensor-parallel-size)", ()),
    "vllm_structured_outputs_regex": (
        None,
        "constrained decoding changes the sampled distribution the loss assumes",
        (),
    ),
    "vllm_group_port": (51216, "the NCCL weight transport picks its own free port", ()),
    "vllm_server_timeout": (240.0, "not wired in: the engine must answer when training starts", ()),
    "request_timeout": (600, "not wired in: a rollout's calls are bounded by rollout_timeout_s", ()),
    "queue_maxsize": (
        1024,
        "the queue holds whole groups: max(2 * groups_per_step, max_concurrent_rollouts / num_generations)",
        (),
    ),
    "heartbeat_stale_after_s": (
        300.0,
        "rollouts run in the trainer's process; each is bounded by rollout_timeout_s",
        (),
    ),
    "fork_threshold_tokens": (
        1024,
        "nothing is re-tokenized: the proxy's capture graph forks on any rewrite, never realigns",
        (),
    ),
    "num_iterations": (1, "each batch of groups makes one optimizer step", ()),
    "importance_sampling_level": ("token", "sequence-level ratios (GSPO) are not implemented", ()),
    "delta": (None, "two-sided clipping (INTELLECT-2) is not implemented", ()),
    "sapo_temperature_neg": (1.05, "only with loss_type='sapo', which is not implemented", ()),
    "sapo_temperature_pos": (1.0, "only with loss_type='sapo', which is not implemented", ()),
    "vespo_k_pos": (2.0, "only with loss_type='vespo', which is not implemented", ()),
    "vespo_lambda_pos": (3.0, "only with loss_type='vespo', which is not implemented", ()),
    "vespo_k_neg": (3.0, "only with loss_type='vespo', which is not implemented", ()),
    "vespo_lambda_neg": (2.0, "only with loss_type='vespo', which is not implemented", ()),
    "multi_objective_aggregation": ("sum_then_normalize", "rewards are summed, then normalised per group", ()),
    "mask_truncated_completions": (False, "not implemented (a truncated turn trains like any other)", ()),
    "sync_ref_model": (False, "the reference model (beta > 0) is the initial policy, never synced", ()),
    "ref_model_mixup_alpha": (0.6, "only with sync_ref_model, which is not implemented", ()),
    "ref_model_sync_steps": (512, "only with sync_ref_model, which is not implemented", ()),
    "entropy_coef": (0.0, "no entropy bonus is added to the loss", ()),
    "use_adaptive_entropy": (False, "no entropy bonus is added to the loss", ()),
    "entropy_coef_min": (0.0, "no entropy bonus is added to the loss", ()),
    "entropy_coef_max": (1.0, "no entropy bonus is added to the loss", ()),
    "entropy_coef_delta": (0.005, "no entropy bonus is added to the loss", ()),
    "entropy_target": (0.2, "no entropy bonus is added to the loss", ()),
    "off_policy_mask_threshold": (None, "off-policy sequence masking is not implemented", ()),
    "log_unique_prompts": (False, "not implemented: log_completions logs every episode it prints", ()),
    "log_completions_hub_repo": (None, "not implemented: save_rollouts writes every trained rollout to output_dir", ()),
}
"""TRL names the trainer does not honour: ``name: (TRL's default, why, other accepted values)``; any other value
is refused."""


def trl_refused(name: str) -> Any:
    """The dataclass field of the TRL name ``name`` in ``REFUSED``: TRL's default, and a help that says why."""
    default, why, also = REFUSED[name]
    accepted = ", ".join(repr(v) for v in (default, *also))
    return dataclasses.field(default=default, metadata={"help": f"TRL's name; only {accepted} here: {why}."})


def _default(config: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


def _is_set(config: Any, name: str) -> bool:
    return getattr(config, name) != _default(config, name)


def apply_trl_settings(config: Any, *, gpu: bool) -> None:
    """Write ``config``'s TRL names onto its own fields (see the module docstring); ``gpu``: the trainer runs on a
    GPU. One ``ValueError`` lists every setting that can't be honoured or contradicts another."""
    problems = _refused(config)
    for apply in (_engine, _importance_sampling, _step_size, _aliases, _loss):
        problems += apply(config, gpu)
    if problems:
        raise ValueError(
            "HarnessGRPOConfig can't honour these settings (TRL's names are explained in "
            "harness_grpo/trl_settings.py):\n  - " + "\n  - ".join(problems)
        )


def _refused(config: Any) -> list[str]:
    problems = []
    for name, (default, why, also) in REFUSED.items():
        value = getattr(config, name)
        if value != default and value not in also:
            problems.append(f"{name}={value!r}: {why}")
    return problems


def _agree(config: Any, ours: str, trl_name: str, value: Any) -> list[str]:
    """Set ``ours`` to ``value`` (what ``trl_name`` asks for) unless ``ours`` was set to something else."""
    if _is_set(config, ours) and getattr(config, ours) != value:
        return [f"{trl_name} asks for {ours}={value!r}, but {ours}={getattr(config, ours)!r} is set: drop one"]
    setattr(config, ours, value)
    return []


def _engine(config: Any, gpu: bool) -> list[str]:
    problems = []
    mode, url = config.vllm_mode, config.vllm_server_base_url
    if mode not in ("server", "colocate"):
        return [f"vllm_mode={mode!r}: 'server' or 'colocate'"]
    host = "localhost" if config.vllm_server_host in ("0.0.0.0", "::", "") else config.vllm_server_host
    from_host_port = f"http://{host}:{config.vllm_server_port}"
    host_port_set = _is_set(config, "vllm_server_host") or _is_set(config, "vllm_server_port")
    if config.use_vllm is None:  # auto: our own name decides
        config.use_vllm = url is not None
        if url is not None:
            config.vllm_mode = mode = "server"
        elif mode == "server":
            return ["vllm_mode='server' needs use_vllm=True (TRL ignores vllm_mode without it) or vllm_server_base_url"]
    if not config.use_vllm:
        if url is not None:
            problems.append(
                f"use_vllm=False asks for the embedded engine, but vllm_server_base_url={url!r} names a server: "
                "drop one"
            )
        if host_port_set:
            problems.append(
                "vllm_server_host/vllm_server_port have no effect without use_vllm=True, vllm_mode='server'"
            )
        return problems
    if mode == "server":
        if url is None:
            config.vllm_server_base_url = from_host_port
        elif host_port_set and url.rstrip("/") != from_host_port:
            problems.append(
                f"vllm_server_base_url={url!r} and vllm_server_host/vllm_server_port ({from_host_port}) disagree: "
                "set one"
            )
        return problems
    # colocate: the engine inside the trainer process
    if url is not None:
        problems.append(
            f"vllm_mode='colocate' runs the engine in the trainer process, but vllm_server_base_url={url!r} names a "
            "server: use vllm_mode='server'"
        )
    if host_port_set:
        problems.append("vllm_server_host/vllm_server_port have no effect with vllm_mode='colocate'")
    if gpu:
        problems.append(
            "use_vllm=True, vllm_mode='colocate' on a GPU would run vLLM inside the trainer process, which "
            "harness-grpo does not do: serve vLLM apart (`vllm serve <model> --logprobs-mode processed_logprobs "
            "--weight-transfer-config '{\"backend\":\"nccl\"}'`, on its own GPU) and set vllm_mode='server' with "
            "vllm_server_base_url, or use_vllm=False for the embedded CPU engine"
        )
    return problems


def _importance_sampling(config: Any, gpu: bool) -> list[str]:
    problems = []
    mode, correction = config.vllm_importance_sampling_mode, config.vllm_importance_sampling_correction
    clip_max, cap_alias = config.vllm_importance_sampling_clip_max, config.vllm_importance_sampling_cap
    if cap_alias is not None:
        if clip_max is not None and clip_max != cap_alias:
            problems.append(
                f"vllm_importance_sampling_cap={cap_alias!r} (deprecated in TRL) and "
                f"vllm_importance_sampling_clip_max={clip_max!r} disagree: set vllm_importance_sampling_clip_max"
            )
        clip_max = cap_alias
    target = None
    if correction is False:
        target = "off"
    elif mode is not None:
        if mode in _SEQUENCE_MODES:
            problems.append(
                f"vllm_importance_sampling_mode={mode!r}: sequence-level importance sampling is not implemented "
                "(a product of ratios over hundreds of tokens overflows); use 'token_truncate' or 'token_mask'"
            )
        elif mode == "token_truncate":
            target = "token_tis"
        elif mode == "token_mask":
            target = "token_mask"
        else:
            problems.append(
                f"vllm_importance_sampling_mode={mode!r}: 'token_truncate', 'token_mask' (or TRL's sequence modes, "
                "which are refused here)"
            )
    if target is not None:
        problems += _agree(config, "importance_sampling", "vllm_importance_sampling_mode/_correction", target)
    if clip_max is not None:
        problems += _agree(config, "importance_sampling_cap", "vllm_importance_sampling_clip_max", float(clip_max))
        config.vllm_importance_sampling_clip_max = float(clip_max)
    elif mode is not None and target is not None and not _is_set(config, "importance_sampling_cap"):
        config.importance_sampling_cap = config.vllm_importance_sampling_clip_max = _TRL_CLIP_MAX
    cap, floor = config.importance_sampling_cap, config.vllm_importance_sampling_clip_min
    if not cap > 1.0:
        problems.append(f"the importance sampling cap ({cap!r}) must be > 1")
    if floor is not None:
        if config.importance_sampling == "off":
            problems.append(f"vllm_importance_sampling_clip_min={floor!r} has no effect with importance sampling off")
        elif not 0.0 <= floor < cap or math.isnan(floor):
            problems.append(f"vllm_importance_sampling_clip_min={floor!r} must be >= 0 and below the cap ({cap!r})")
    elif mode == "token_mask" and target == "token_mask":
        config.vllm_importance_sampling_clip_min = 0.0  # TRL's token_mask: no lower bound unless clip_min is set
    return problems


def _step_size(config: Any, gpu: bool) -> list[str]:
    batch, steps = config.generation_batch_size, config.steps_per_generation
    if batch is not None and steps is not None:
        return ["'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"]
    if steps is not None and steps != 1:
        return [
            f"steps_per_generation={steps!r}: every optimizer step trains on its own groups, produced while the "
            "earlier steps trained; size a step with generation_batch_size (num_generations * groups_per_step)"
        ]
    if batch is None:
        return []
    if batch <= 0 or batch % config.num_generations:
        return [
            f"generation_batch_size ({batch}) must be a positive multiple of num_generations "
            f"({config.num_generations}): a step trains on whole groups"
        ]
    return _agree(config, "groups_per_step", "generation_batch_size", batch // config.num_generations)


def _aliases(config: Any, gpu: bool) -> list[str]:
    problems = []
    if config.max_inflight_tasks != -1:
        problems += _agree(config, "max_concurrent_rollouts", "max_inflight_tasks", config.max_inflight_tasks)
    if config.weight_sync_timeout is not None:
        problems += _agree(config, "weight_sync_timeout_s", "weight_sync_timeout", float(config.weight_sync_timeout))
    budget = config.token_budget
    if budget is not None:
        if budget <= 0:
            problems.append(
                f"token_budget={budget!r}: fixed-count packing is not implemented; rows are always packed by tokens "
                "(a budget > 0, or max_tokens_per_microbatch)"
            )
        else:
            problems += _agree(config, "max_tokens_per_microbatch", "token_budget", budget)
    return problems


def _loss(config: Any, gpu: bool) -> list[str]:
    problems = []
    if config.loss_type is not None:
        if config.loss_type == "dapo":
            problems += _agree(config, "loss_weighting", "loss_type='dapo'", "token")
        else:
            problems.append(
                f"loss_type={config.loss_type!r}: only 'dapo' (every trainable token of the step weighs the same) is "
                "implemented; loss_weighting='rollout' makes every rollout count once instead"
            )
    scale = config.scale_rewards
    if isinstance(scale, str):
        named = {"group": True, "true": True, "none": False, "false": False}.get(scale.lower())
        if named is None:
            problems.append(
                f"scale_rewards={scale!r}: 'group' (or True) and 'none' (or False); 'batch' is not implemented"
            )
        else:
            config.scale_rewards = named
    if config.use_bias_correction_kl and config.beta > 0:
        problems.append("use_bias_correction_kl=True: the KL term (beta > 0) is not importance-weighted here")
    return problems
