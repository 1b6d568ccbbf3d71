"""Checkpoints of a training run: write, find, rotate and load ``checkpoint-N`` directories.

A checkpoint holds the full model and tokenizer (loadable by ``from_pretrained``), accelerate's
state (optimizer, scheduler, RNG of every rank; sharded under FSDP2) and the trainer's state
(``harness_trainer_state.json``: step, dataset position, policy version, dropped groups, tokens
seen, log history). It is written to a temporary directory and renamed, so a kill leaves the last
complete checkpoint; only directories holding the trainer state count as complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "harness_trainer_state.json"
ACCELERATE_STATE = "accelerate_state"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The highest-numbered complete ``checkpoint-N`` under ``output_dir``."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := CHECKPOINT_RE.match(p.name)) and (p / TRAINER_STATE).exists()
    ]
    return max(found)[1] if found else None


def save_checkpoint(trainer: Any) -> Path:
    """Write ``checkpoint-<global_step>`` under ``trainer.args.output_dir`` (a collective: every rank calls it)."""
    root = Path(trainer.args.output_dir)
    step = trainer.state.global_step
    final, tmp = root / f"checkpoint-{step}", root / f".tmp-checkpoint-{step}"
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
        state = {
            "global_step": step,
            "dataset_position": trainer.dataset_position,
            "policy_version": trainer.policy_version,
            "dropped_stale": trainer.dropped_stale,
            "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
            "log_history": trainer.state.log_history,
        }
        (tmp / TRAINER_STATE).write_text(json.dumps(state, default=float))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        rotate_checkpoints(root, trainer.args.save_total_limit)
    accelerator.wait_for_everyone()
    return final


def rotate_checkpoints(root: Path, limit: int | None) -> None:
    """Keep the ``limit`` highest-numbered checkpoints (all when ``limit`` is falsy)."""
    if not limit:
        return
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)))
    for _, path in found[:-limit]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(trainer: Any, checkpoint: Path) -> None:
    """Restore ``trainer`` (model, optimizer, scheduler, RNG, counters) from ``checkpoint``."""
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    trainer.accelerator.load_state(str(checkpoint / ACCELERATE_STATE))
    trainer.state.global_step = state["global_step"]
    trainer.state.num_input_tokens_seen = state["num_input_tokens_seen"]
    trainer.state.log_history = state["log_history"]
    trainer.dataset_position = state["dataset_position"]
    trainer.policy_version = state["policy_version"]
    trainer.dropped_stale = state["dropped_stale"]
