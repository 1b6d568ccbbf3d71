"""Pushing a run to the Hugging Face Hub (``push_to_hub``), as transformers' ``Trainer`` pushes one.

``HubPusher(args)`` talks to the Hub through ``huggingface_hub.HfApi(token=hub_token)``; rank 0
alone calls it. The repository is ``hub_model_id``, or the name of ``output_dir`` under the token's
user; ``create_repo`` (private when ``hub_private_repo``) makes it at the start of training, and the
``hub_revision`` branch when one is named. At each checkpoint, by ``hub_strategy``:

- ``every_save``: the checkpoint's model and tokenizer files are copied to ``output_dir``, which is
  uploaded (without ``checkpoint-*``, ``_*``, temporary checkpoints or the proxy journal);
- ``checkpoint``: that, and the checkpoint folder as ``last-checkpoint/`` (to resume from);
- ``all_checkpoints``: that, and every checkpoint folder under its own name;
- ``end``: nothing.

At the end of training the final model and tokenizer are saved in ``output_dir`` and uploaded
("End of training"), whatever the strategy. Uploads are synchronous, so none is skipped (as with
``hub_always_push``) and the run waits for each.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from huggingface_hub import HfApi
from transformers import TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy

from harness_grpo.checkpoints import TRAINER_STATE

# Not the model: checkpoints (pushed on their own by strategy), private files, the agents' session journal.
IGNORED = ["_*", f"{PREFIX_CHECKPOINT_DIR}-*", f".tmp-{PREFIX_CHECKPOINT_DIR}-*", "proxy_journal", "proxy_journal/*"]


class HubPusher:
    """Uploads ``args.output_dir`` and checkpoints to the run's Hub repository (see the module docstring)."""

    def __init__(self, args: TrainingArguments) -> None:
        self.args = args
        self.api = HfApi(token=args.hub_token)
        self.repo_id: str | None = None

    def create_repo(self) -> str:
        """Create (or find) the repository and the ``hub_revision`` branch; returns the repository id."""
        args = self.args
        name = args.hub_model_id or Path(args.output_dir).absolute().name
        self.repo_id = self.api.create_repo(name, private=args.hub_private_repo, exist_ok=True).repo_id
        if args.hub_revision:
            self.api.create_branch(self.repo_id, branch=args.hub_revision, exist_ok=True)
        return self.repo_id

    def push_checkpoint(self, checkpoint: Path, *, step: int, epoch: float) -> None:
        """After ``checkpoint`` was written: push its model to the repository's root and, by strategy, the folder."""
        args = self.args
        if args.hub_strategy == HubStrategy.END:
            return
        output_dir = Path(args.output_dir)
        for item in checkpoint.iterdir():  # model, config and tokenizer files, not the training state
            if item.is_file() and item.name != TRAINER_STATE:
                shutil.copy(item, output_dir / item.name)
        message = (
            f"Training in progress, step {step}"
            if args.save_strategy == "steps"
            else f"Training in progress, epoch {int(epoch)}"
        )
        self._upload(output_dir, message, ignore_patterns=IGNORED)
        if args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            path_in_repo = "last-checkpoint" if args.hub_strategy == HubStrategy.CHECKPOINT else checkpoint.name
            self._upload(checkpoint, message + ", checkpoint", path_in_repo=path_in_repo)

    def push_final(self) -> None:
        """Upload ``output_dir`` (the final model is already saved there) at the end of training."""
        self._upload(Path(self.args.output_dir), "End of training", ignore_patterns=IGNORED)

    def _upload(self, folder: Path, message: str, **kwargs: object) -> None:
        if self.repo_id is None:
            self.create_repo()
        self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=str(folder),
            commit_message=message,
            revision=self.args.hub_revision,
            **kwargs,
        )
