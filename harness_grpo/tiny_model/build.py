"""Deterministic build of the tiny embedded-default model.

Contract: from the files in this package (corpus, chat template) and a seed,
``build_tiny_model(dest)`` writes a transformers checkpoint (Qwen3
architecture, byte-level BPE tokenizer, ChatML + ``<tool_call>`` template) to
``dest``. The same recipe gives byte-identical weights and tokenizer on any
CPU. ``tiny_model_path()`` caches the build under a directory named by the
recipe's digest, so changing any input rebuilds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

PACKAGE_DIR = Path(__file__).parent
CORPUS_DIR = PACKAGE_DIR / "corpus"
CHAT_TEMPLATE_PATH = PACKAGE_DIR / "chat_template.jinja"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Markup the template and tool-call parser rely on; single ids, but not
# "special", so they survive ``skip_special_tokens`` decoding as in Qwen3.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

RECIPE = {
    "seed": 0,
    "vocab_size": 8192,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
}

SERVED_MODEL_NAME = "harness-grpo/tiny-qwen3"


def recipe_digest() -> str:
    """Digest of every input of the build: recipe, template, corpus, this file."""
    h = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    for path in [Path(__file__), CHAT_TEMPLATE_PATH, *sorted(CORPUS_DIR.iterdir())]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """``$HARNESS_GRPO_CACHE`` or ``~/.cache/harness_grpo``."""
    return Path(os.environ.get("HARNESS_GRPO_CACHE", Path.home() / ".cache" / "harness_grpo"))


def _corpus_texts() -> list[str]:
    texts = []
    for path in sorted(CORPUS_DIR.glob("*.txt.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            body = f.read()
        # Chunk so the trainer sees many documents; split on blank lines only.
        texts.extend(chunk for chunk in body.split("\n\n") if chunk.strip())
    texts.extend([CHAT_TEMPLATE_PATH.read_text()] * 20)
    return texts


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on the shipped corpus (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"] - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_texts(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=RECIPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE_PATH.read_text()
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 model, seeded."""
    r = RECIPE
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=r["hidden_size"],
        intermediate_size=r["intermediate_size"],
        num_hidden_layers=r["num_hidden_layers"],
        num_attention_heads=r["num_attention_heads"],
        num_key_value_heads=r["num_key_value_heads"],
        head_dim=r["head_dim"],
        max_position_embeddings=r["max_position_embeddings"],
        rope_theta=r["rope_theta"],
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(r["seed"])
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny_model(dest: Path) -> Path:
    """Build tokenizer and model into ``dest`` (created)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(dest)
    model.save_pretrained(dest)
    (dest / "recipe.json").write_text(json.dumps({"recipe": RECIPE, "digest": recipe_digest()}, indent=1))
    return dest


def cached_build(name: str, builder) -> Path:
    """Run ``builder(tmpdir)`` once per ``name`` under the cache root, atomically."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (final / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                builder(tmp)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def tiny_model_path() -> Path:
    """Path to the base tiny model, building it on first use."""
    return cached_build(f"tiny-qwen3-{recipe_digest()}", build_tiny_model)
