"""Loading the causal LM that the trainer trains and the embedded engine samples from.

With the ``kernels`` package installed, transformers (5.25 and later) loads models with Hub kernels on
by default: on a GPU, ``model.train()`` or ``model.eval()`` then swaps layers (rotary embeddings, norms)
for code downloaded from the Hub. That needs the Hub while training (an offline GPU machine fails at the
first optimizer step: "could not verify publisher trust status") and computes the trained policy with
other code than the engine samples it with. ``load_causal_lm`` keeps transformers' own layers; a user who
wants Hub kernels loads the model and passes it to the trainer.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


def load_causal_lm(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained(path)`` without Hub kernels; ``dtype`` None: the checkpoint's."""
    kwargs = {"dtype": dtype} if dtype is not None else {}
    return AutoModelForCausalLM.from_pretrained(path, use_kernels=False, **kwargs)
