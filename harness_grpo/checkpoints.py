"""Checkpoints of a training run: write, find, rotate and load ``checkpoint-N`` directories.

A checkpoint holds the full model and tokenizer (loadable by ``from_pretrained``), accelerate's
state (optimizer, scheduler, RNG of every rank; sharded under FSDP2) and the trainer's state:
transformers' ``TrainerState`` in its own ``trainer_state.json`` (step, epoch, tokens seen, log
history ...), extended by ``HarnessTrainerState`` with what resuming GRPO needs besides (dataset
position, policy version, dropped groups). It is written to a temporary directory and renamed, so
a kill leaves the last complete checkpoint. Directory names, discovery and rotation are
transformers' (``PREFIX_CHECKPOINT_DIR``, ``get_last_checkpoint``, ``rotate_checkpoints``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints

TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
ACCELERATE_STATE = "accelerate_state"
# What a resumed run keeps of its own state rather than the checkpoint's.
_THIS_RUNS = (
    "max_steps",
    "num_train_epochs",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "is_world_process_zero",
    "is_local_process_zero",
)


@dataclass
class HarnessTrainerState(TrainerState):
    """``TrainerState`` (what callbacks see, saved with its own json methods) plus the run's GRPO position.

    ``dataset_position``: dataset rows consumed (the next group starts at this row, modulo the
    dataset's length); ``policy_version``: weight syncs so far (the engine's version);
    ``dropped_groups``: groups dropped as too stale.
    """

    dataset_position: int = 0
    policy_version: int = 0
    dropped_groups: int = 0


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The highest-numbered ``checkpoint-N`` under ``output_dir`` (None: none, or no such directory)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = get_last_checkpoint(str(root))
    return Path(found) if found else None


def save_checkpoint(trainer: Any) -> Path:
    """Write ``checkpoint-<global_step>`` under ``trainer.args.output_dir`` (a collective: every rank calls it),
    then keep the ``save_total_limit`` newest."""
    root = Path(trainer.args.output_dir)
    step = trainer.state.global_step
    final = root / f"{PREFIX_CHECKPOINT_DIR}-{step}"
    tmp = root / f".tmp-{PREFIX_CHECKPOINT_DIR}-{step}"  # not a checkpoint-* name: never found or rotated
    accelerator = trainer.accelerator
    if trainer.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(trainer.model)  # a collective under FSDP2
    if trainer.is_main:
        accelerator.unwrap_model(trainer.model).save_pretrained(tmp, state_dict=state_dict)
        trainer.tokenizer.save_pretrained(tmp)
    accelerator.save_state(str(tmp / ACCELERATE_STATE), safe_serialization=True)
    accelerator.wait_for_everyone()
    if trainer.is_main:
        trainer.state.save_to_json(str(tmp / TRAINER_STATE))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        rotate_checkpoints(str(root), trainer.args.save_total_limit)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(trainer: Any, checkpoint: Path) -> None:
    """Restore ``trainer`` (model, optimizer, scheduler, RNG, ``trainer.state``) from ``checkpoint``.

    The restored state keeps this run's ``max_steps``, step intervals and process flags."""
    state_file = checkpoint / TRAINER_STATE
    if not state_file.is_file():
        raise ValueError(f"{checkpoint} is not a complete checkpoint: it has no {TRAINER_STATE}")
    saved = HarnessTrainerState.load_from_json(str(state_file))
    trainer.accelerator.load_state(str(checkpoint / ACCELERATE_STATE))
    for name in _THIS_RUNS:
        setattr(saved, name, getattr(trainer.state, name))
    trainer.state = saved
