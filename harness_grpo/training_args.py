"""Which ``TrainingArguments`` settings ``HarnessAsyncGRPOTrainer`` honours, and the setup they drive.

Every ``TrainingArguments`` field is in exactly one of three tables below; ``check_training_args``
refuses, with one ``ValueError`` naming every offending field and why, any field that is set to a
value other than ``TrainingArguments``' default and is not honoured. A field a future transformers
adds is in no table, so it is refused until someone decides what it means here. The fields
``HarnessGRPOConfig`` adds are all its own and all honoured.

Honoured (``HONOURED``; how):

- ``output_dir``, ``max_steps``, ``num_train_epochs`` (passes over the dataset when ``max_steps`` is
  unset; ``on_epoch_begin``/``on_epoch_end`` at each pass), ``seed``/``full_determinism``
  (``set_seed``/``enable_full_determinism`` at construction; the seed also seeds the rollout sessions);
- optimizer: ``optim``, ``optim_args``, ``optim_target_modules``, ``weight_decay``, ``adam_*`` through
  ``Trainer.get_optimizer_cls_and_kwargs`` with transformers' no-decay groups (biases, norms)
  (``create_optimizer``); optimizers that need transformers' own training step are refused;
- schedule: ``learning_rate``, ``lr_scheduler_type``, ``lr_scheduler_kwargs``, ``warmup_steps``
  (steps, or a fraction of ``max_steps`` below 1) through ``get_scheduler`` (``create_scheduler``);
- ``max_grad_norm`` (0: no clipping, the norm is still logged), ``bf16``/``fp16`` (accelerate's
  mixed precision; fp16 needs a CUDA GPU), ``tf32`` (applied by ``TrainingArguments`` itself),
  ``gradient_checkpointing``/``activation_checkpointing`` and their kwargs
  (``enable_activation_checkpointing``), ``use_cpu``;
- distributed: ``ddp_backend``, ``ddp_timeout`` (``TrainingArguments`` sets up the process group),
  ``ddp_find_unused_parameters``, ``ddp_bucket_cap_mb``, ``ddp_broadcast_buffers``, ``ddp_static_graph``
  (accelerate's ``DistributedDataParallelKwargs``);
- logging: ``logging_strategy``, ``logging_steps``, ``logging_first_step`` (``DefaultFlowCallback``),
  ``log_level``, ``log_level_replica``, ``log_on_each_node`` (transformers' verbosity, as ``Trainer``),
  ``include_num_input_tokens_seen`` (logs ``num_input_tokens_seen``), ``disable_tqdm`` (the progress
  bar), ``report_to``, ``run_name``, ``project``, ``trackio_*`` (transformers' reporting callbacks);
- checkpoints: ``save_strategy`` (not ``best``), ``save_steps``, ``save_total_limit``
  (``harness_grpo.checkpoints``), ``resume_from_checkpoint`` (``train()``'s default; ``True`` or
  ``"true"``: the last checkpoint), ``ignore_data_skip`` (a resumed run restarts its current pass over
  the dataset from the first row);
- Hub: ``push_to_hub``, ``hub_model_id``, ``hub_strategy``, ``hub_token``, ``hub_private_repo``,
  ``hub_revision``, ``hub_always_push`` (``harness_grpo.hub``; pushes are synchronous, so every
  save is pushed, as with ``hub_always_push``);
- ``train_sampling_strategy``: rows are walked in dataset order, ``"sequential"`` only (the config's
  default; shuffle the dataset yourself).

Harmless (``HARMLESS``; any value is fine, see the table for why) and refused when set
(``UNSUPPORTED``; why) are listed in their tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from accelerate.utils import DistributedDataParallelKwargs
from transformers import PreTrainedModel, Trainer, TrainingArguments, get_scheduler
from transformers.trainer_optimizer import is_optimizer_factory
from transformers.trainer_utils import enable_full_determinism, set_seed
from transformers.training_args import OptimizerNames

HONOURED: dict[str, str] = {
    "output_dir": "checkpoints, the proxy journal, reports and the final model go here",
    "max_steps": "the run's number of optimizer steps",
    "num_train_epochs": "passes over the dataset when max_steps is unset; epoch events at each pass",
    "seed": "set_seed at construction; seeds the rollout sessions",
    "full_determinism": "enable_full_determinism instead of set_seed",
    "optim": "Trainer.get_optimizer_cls_and_kwargs",
    "optim_args": "Trainer.get_optimizer_cls_and_kwargs",
    "optim_target_modules": "Trainer.get_optimizer_cls_and_kwargs (GaLore, APOLLO)",
    "weight_decay": "the decay group of transformers' parameter groups (not biases and norms)",
    "adam_beta1": "Trainer.get_optimizer_cls_and_kwargs",
    "adam_beta2": "Trainer.get_optimizer_cls_and_kwargs",
    "adam_epsilon": "Trainer.get_optimizer_cls_and_kwargs",
    "learning_rate": "get_scheduler",
    "lr_scheduler_type": "get_scheduler",
    "lr_scheduler_kwargs": "get_scheduler",
    "warmup_steps": "get_scheduler with args.get_warmup_steps(max_steps)",
    "max_grad_norm": "accelerator.clip_grad_norm_ before each optimizer step (0: no clipping)",
    "bf16": "Accelerator(mixed_precision='bf16')",
    "fp16": "Accelerator(mixed_precision='fp16'), CUDA only",
    "tf32": "applied by TrainingArguments itself",
    "gradient_checkpointing": "model.activation_checkpointing_enable",
    "gradient_checkpointing_kwargs": "model.activation_checkpointing_enable",
    "activation_checkpointing": "model.activation_checkpointing_enable",
    "activation_checkpointing_kwargs": "model.activation_checkpointing_enable",
    "use_cpu": "Accelerator(cpu=True)",
    "ddp_backend": "TrainingArguments' process-group setup",
    "ddp_timeout": "TrainingArguments' process-group setup",
    "ddp_find_unused_parameters": "DistributedDataParallelKwargs (default here: False)",
    "ddp_bucket_cap_mb": "DistributedDataParallelKwargs",
    "ddp_broadcast_buffers": "DistributedDataParallelKwargs",
    "ddp_static_graph": "DistributedDataParallelKwargs",
    "logging_strategy": "DefaultFlowCallback",
    "logging_steps": "DefaultFlowCallback",
    "logging_first_step": "DefaultFlowCallback",
    "log_level": "transformers' verbosity, set as Trainer sets it",
    "log_level_replica": "transformers' verbosity, set as Trainer sets it",
    "log_on_each_node": "transformers' verbosity, set as Trainer sets it",
    "include_num_input_tokens_seen": "num_input_tokens_seen in the logs ('all': padding included)",
    "disable_tqdm": "the progress bar",
    "report_to": "transformers' reporting callbacks",
    "run_name": "transformers' reporting callbacks",
    "project": "transformers' reporting callbacks",
    "trackio_space_id": "transformers' reporting callbacks",
    "trackio_bucket_id": "transformers' reporting callbacks",
    "trackio_static_space_id": "transformers' reporting callbacks",
    "save_strategy": "DefaultFlowCallback ('steps', 'epoch', 'no')",
    "save_steps": "DefaultFlowCallback",
    "save_total_limit": "transformers.trainer_utils.rotate_checkpoints",
    "resume_from_checkpoint": "train()'s default; True or 'true': the last checkpoint in output_dir",
    "ignore_data_skip": "a resumed run restarts its current pass over the dataset",
    "push_to_hub": "harness_grpo.hub",
    "hub_model_id": "harness_grpo.hub",
    "hub_strategy": "harness_grpo.hub",
    "hub_token": "harness_grpo.hub",
    "hub_private_repo": "harness_grpo.hub",
    "hub_revision": "harness_grpo.hub",
    "hub_always_push": "pushes are synchronous: every save is pushed",
    "train_sampling_strategy": "rows are walked in dataset order: 'sequential' only",
}

HARMLESS: dict[str, str] = {
    "do_train": "a flag for scripts; Trainer does not read it either",
    "local_rank": "accelerate reads the rank from the environment",
    "dataloader_pin_memory": "there is no DataLoader (TrainingArguments turns it off under use_cpu)",
    "remove_unused_columns": "rows never become model inputs; every column reaches trainer-bound factories",
    "use_cache": "the loss forward always passes use_cache=False",
    "logging_nan_inf_filter": "each logged loss is its own step's; there is no running average to protect",
}

_NO_EVAL = "there is no evaluation loop (the reward of each step's rollouts is logged instead)"
_NO_DATALOADER = "there is no DataLoader or sampler: rows come from rollouts, dataset rows are walked in order"
_STEP_SIZE = (
    "a step is groups_per_step groups of num_generations rollouts, packed into micro-batches of at most "
    "max_tokens_per_microbatch tokens whose gradients all accumulate into one optimizer step"
)
_FROM_LAUNCH = "not wired in; configure it through `accelerate launch` (see launchers/train.py)"

UNSUPPORTED: dict[str, str] = {
    "per_device_train_batch_size": _STEP_SIZE,
    "gradient_accumulation_steps": _STEP_SIZE,
    "auto_find_batch_size": _STEP_SIZE,
    "average_tokens_across_devices": "the loss is always normalised by the whole step's tokens over all ranks",
    "label_smoothing_factor": "the GRPO loss has no labels",
    "label_names": "the GRPO loss has no labels",
    "bf16_full_eval": _NO_EVAL,
    "fp16_full_eval": _NO_EVAL,
    "eval_strategy": _NO_EVAL,
    "eval_steps": _NO_EVAL,
    "eval_delay": _NO_EVAL,
    "eval_on_start": _NO_EVAL,
    "per_device_eval_batch_size": _NO_EVAL,
    "prediction_loss_only": _NO_EVAL,
    "eval_do_concat_batches": _NO_EVAL,
    "eval_use_gather_object": _NO_EVAL,
    "eval_accumulation_steps": _NO_EVAL,
    "include_for_metrics": _NO_EVAL,
    "batch_eval_metrics": _NO_EVAL,
    "do_eval": _NO_EVAL,
    "do_predict": _NO_EVAL,
    "load_best_model_at_end": _NO_EVAL,
    "metric_for_best_model": _NO_EVAL,
    "greater_is_better": _NO_EVAL,
    "torch_compile": "not wired in (every step packs differently shaped micro-batches)",
    "torch_compile_backend": "not wired in (every step packs differently shaped micro-batches)",
    "torch_compile_mode": "not wired in (every step packs differently shaped micro-batches)",
    "use_liger_kernel": "not wired in (the loss computes its own logprobs from the model's logits)",
    "liger_kernel_config": "not wired in (the loss computes its own logprobs from the model's logits)",
    "neftune_noise_alpha": "not wired in",
    "torch_empty_cache_steps": "not wired in",
    "debug": "not wired in",
    "skip_memory_metrics": "no memory metrics are collected",
    "save_only_model": "a checkpoint always holds what resuming needs",
    "save_on_each_node": "rank 0 writes every checkpoint",
    "enable_jit_checkpoint": "not wired in (checkpoints are written atomically at save steps)",
    "restore_callback_states_from_checkpoint": "callback states are not saved in checkpoints",
    "data_seed": _NO_DATALOADER,
    "dataloader_drop_last": _NO_DATALOADER,
    "dataloader_num_workers": _NO_DATALOADER,
    "dataloader_persistent_workers": _NO_DATALOADER,
    "dataloader_prefetch_factor": _NO_DATALOADER,
    "dataloader_multiprocessing_context": _NO_DATALOADER,
    "dataloader_in_order": _NO_DATALOADER,
    "length_column_name": _NO_DATALOADER,
    "accelerator_config": "its settings are the DataLoader's and gradient accumulation's, neither used here",
    "parallelism_config": _FROM_LAUNCH,
    "fsdp": _FROM_LAUNCH,
    "fsdp_config": _FROM_LAUNCH,
    "deepspeed": "DeepSpeed is not supported (FSDP2 or DDP through accelerate are)",
}

# Other spellings of a default: what TrainingArguments.__post_init__ or HfArgumentParser make of it.
_NORMALISED_DEFAULTS: dict[str, tuple[Any, ...]] = {"debug": ([], None)}

# Optimizers whose step transformers' Trainer runs itself (fused backward, per-parameter hooks), or
# whose training weights are not the ones to serve (schedule-free), which the weight sync would push.
_OWN_STEP_OPTIMIZERS: dict[str, str] = {
    OptimizerNames.LOMO.value: "it runs its own fused backward inside Trainer.training_step",
    OptimizerNames.ADALOMO.value: "it runs its own fused backward inside Trainer.training_step",
    OptimizerNames.GALORE_ADAMW_LAYERWISE.value: "layer-wise optimizers step from gradient hooks Trainer installs",
    OptimizerNames.GALORE_ADAMW_8BIT_LAYERWISE.value: "layer-wise optimizers step from gradient hooks Trainer installs",
    OptimizerNames.GALORE_ADAFACTOR_LAYERWISE.value: "layer-wise optimizers step from gradient hooks Trainer installs",
    OptimizerNames.APOLLO_ADAMW_LAYERWISE.value: "layer-wise optimizers step from gradient hooks Trainer installs",
    OptimizerNames.SCHEDULE_FREE_ADAMW.value: "schedule-free training weights are not the weights to sample from",
    OptimizerNames.SCHEDULE_FREE_RADAM.value: "schedule-free training weights are not the weights to sample from",
    OptimizerNames.SCHEDULE_FREE_SGD.value: "schedule-free training weights are not the weights to sample from",
}


def _training_arguments_defaults() -> dict[str, Any]:
    defaults = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def _is_default(name: str, value: Any, default: Any) -> bool:
    if name == "accelerator_config" and value is not None:
        return value == type(value)()
    if value == default:
        return True
    return any(value == same for same in _NORMALISED_DEFAULTS.get(name, ()))


def _shown(value: Any) -> str:
    """``repr`` with transformers' string enums shown as their strings."""
    if isinstance(value, list):
        return repr([getattr(v, "value", v) for v in value])
    return repr(getattr(value, "value", value))


def check_optim_name(optim: Any) -> None:
    """``ValueError`` naming ``optim`` unless transformers knows the name (called before ``TrainingArguments``
    parses it, whose own error does not name the setting)."""
    known = [name.value for name in OptimizerNames]
    if str(getattr(optim, "value", optim)) not in known:
        raise ValueError(f"optim={optim!r} is not an optimizer transformers knows; choose from {known}")


def check_training_args(args: TrainingArguments) -> None:
    """Raise one ``ValueError`` naming every setting of ``args`` this trainer would not honour, and why.

    A ``TrainingArguments`` field passes if it is honoured (``HONOURED``, with the value limits below),
    harmless (``HARMLESS``), or at ``TrainingArguments``' default; fields of subclasses (``HarnessGRPOConfig``'s
    own) pass. Works on ``args`` before and after ``TrainingArguments.__post_init__`` (which turns strings
    into enums and derives some fields: ``do_eval`` from ``eval_strategy``, for one).

    Value limits: ``save_strategy`` not ``"best"``; ``train_sampling_strategy`` ``"sequential"``; no
    warm-up with the ``"constant"`` schedule (it has none); no ``optim`` that needs ``Trainer``'s own
    step; fp16 only on a CUDA GPU.
    """
    defaults = _training_arguments_defaults()
    problems = []
    for name, default in defaults.items():
        value = getattr(args, name)
        if name in HONOURED or name in HARMLESS or _is_default(name, value, default):
            continue
        why = UNSUPPORTED.get(name, "not reviewed for HarnessAsyncGRPOTrainer: refused until someone decides")
        problems.append(f"{name}={_shown(value)}: {why}")
    problems += _value_limits(args)
    if problems:
        raise ValueError(
            "HarnessAsyncGRPOTrainer does not honour these TrainingArguments settings "
            "(harness_grpo/training_args.py lists what it honours):\n  - " + "\n  - ".join(problems)
        )


def _value_limits(args: TrainingArguments) -> list[str]:
    problems = []
    if args.save_strategy == "best":
        problems.append(f"save_strategy='best': {_NO_EVAL}")
    if args.train_sampling_strategy != "sequential":
        problems.append(
            f"train_sampling_strategy={args.train_sampling_strategy!r}: rows are walked in dataset order "
            "('sequential'); shuffle the dataset yourself"
        )
    if args.lr_scheduler_type == "constant" and args.warmup_steps > 0:
        problems.append(
            f"warmup_steps={args.warmup_steps!r}: lr_scheduler_type='constant' has no warm-up; use "
            "'constant_with_warmup', 'linear' or 'cosine'"
        )
    optim = str(getattr(args.optim, "value", args.optim))
    if optim in _OWN_STEP_OPTIMIZERS:
        problems.append(f"optim={optim!r}: {_OWN_STEP_OPTIMIZERS[optim]}")
    fp16 = args.fp16 or getattr(args, "mixed_precision", "no") == "fp16"  # the latter: set by an accelerate launch
    if fp16 and (args.use_cpu or not torch.cuda.is_available()):
        problems.append("fp16=True: fp16 mixed precision needs a CUDA GPU (loss scaling); on CPU use bf16=True")
    return problems


# --- setup ------------------------------------------------------------------------------------------------------


def seed_everything(args: TrainingArguments) -> None:
    """``enable_full_determinism(seed)`` with ``full_determinism``, else ``set_seed(seed)`` (as ``Trainer``)."""
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)


def accelerator_kwargs(args: TrainingArguments) -> dict[str, Any]:
    """``Accelerator(**kwargs)``: CPU or not, mixed precision (``bf16``/``fp16``, or the launch's), DDP settings.

    Under ``accelerate launch`` the launch's FSDP2/DDP settings still apply; an unset
    ``ddp_find_unused_parameters`` is False (every step's backward reaches every parameter).
    """
    ddp = {"find_unused_parameters": bool(args.ddp_find_unused_parameters)}
    for name, key in (
        ("ddp_bucket_cap_mb", "bucket_cap_mb"),
        ("ddp_broadcast_buffers", "broadcast_buffers"),
        ("ddp_static_graph", "static_graph"),
    ):
        if getattr(args, name) is not None:
            ddp[key] = getattr(args, name)
    return {
        "cpu": args.use_cpu or not torch.cuda.is_available(),
        "mixed_precision": args.mixed_precision,
        "kwargs_handlers": [DistributedDataParallelKwargs(**ddp)],
    }


def enable_activation_checkpointing(args: TrainingArguments, model: PreTrainedModel) -> None:
    """With ``activation_checkpointing`` (or its alias ``gradient_checkpointing``), enable it on ``model`` as
    ``Trainer`` does: ``every_n_layers`` and ``offload`` come out of the kwargs, the rest go to
    ``torch.utils.checkpoint``."""
    if not args.activation_checkpointing:
        return
    kwargs = dict(args.activation_checkpointing_kwargs or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    if not hasattr(model, "activation_checkpointing_enable"):
        raise ValueError(f"gradient_checkpointing=True: {type(model).__name__} has no activation_checkpointing_enable")
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=kwargs or None, every_n_layers=every_n_layers, offload=offload
    )


def create_optimizer(args: TrainingArguments, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``Trainer.create_optimizer`` would build: class and kwargs from
    ``Trainer.get_optimizer_cls_and_kwargs(args, model)`` (``optim``, ``optim_args``, ``learning_rate``,
    ``adam_*``), over transformers' two parameter groups, ``weight_decay`` on all but biases and norms.
    An optimizer that cannot be built here (a missing package, bad ``optim_args``) is a ``ValueError``
    naming ``optim``."""
    # An instance method of Trainer that reads nothing from the instance.
    decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for name, p in trainable if name in decay], "weight_decay": args.weight_decay},
        {"params": [p for name, p in trainable if name not in decay], "weight_decay": 0.0},
    ]
    try:
        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
        if is_optimizer_factory(optimizer_cls):  # Muon, Dion: they split the model's parameters themselves
            return optimizer_cls()(model, **kwargs)
        params = kwargs.pop("params", groups)  # GaLore and APOLLO build their own groups
        return optimizer_cls(params, **kwargs)
    except (ImportError, ValueError, TypeError, RuntimeError) as error:
        optim = str(getattr(args.optim, "value", args.optim))
        raise ValueError(f"optim={optim!r} (optim_args={args.optim_args!r}) can't be built: {error}") from error


def create_scheduler(
    args: TrainingArguments, optimizer: torch.optim.Optimizer, max_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``get_scheduler(lr_scheduler_type, ...)`` over ``max_steps`` with ``args.get_warmup_steps(max_steps)``
    warm-up steps and ``lr_scheduler_kwargs``, as ``Trainer.create_scheduler``."""
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(max_steps),
        num_training_steps=max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
    )
