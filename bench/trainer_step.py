"""One GRPO optimizer step: trainer tokens/s, packing utilization, micro-batches.

Synthetic rows shaped like agent traces: `--rollouts` rollouts in groups of 8, each of 1-3 rows of
500-4000 tokens; a row is a prompt (context) then turns of sampled tokens (trained) and tool output
(context), about 30% trainable. Each configuration runs the same rows: pack, then per micro-batch
`token_logprobs` + `grpo_loss` + backward, then one AdamW step. The main table varies the token
budget (padded layout, projection only at trained positions); `--compare` adds, at the first budget,
the packed 1D layout and the full-vocabulary projection at every position, side by side.

    .venv/bin/python bench/trainer_step.py [--rollouts 64] [--budgets 8192 32768] [--no-compare]

On a GPU, `--device cuda --model qwen3-0.6b --bf16` runs the step at a real model's size: Qwen3-0.6B's
architecture (its published config) with random weights, so no download is needed; `--bf16` is the
trainer's `bf16=True` (float32 weights and optimizer, bfloat16 autocast).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoModelForCausalLM, Qwen3Config

from harness_grpo.advantages import group_advantages
from harness_grpo.loss import LossConfig, grpo_loss, merge_metrics, token_logprobs
from harness_grpo.model_loading import load_causal_lm
from harness_grpo.packing import Layout, pack_rows
from harness_grpo.rows import Row, rollout_rows
from harness_grpo.tiny_model import tiny_model_path
from proxy.capture_graph import AGENT, TrainingSequence

GROUP = 8
# Qwen/Qwen3-0.6B's config.json, the fields that shape the computation.
QWEN3_0_6B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def synthetic_sequence(rng: random.Random, vocab: int) -> TrainingSequence:
    n = rng.randint(500, 4000)
    prompt = rng.randint(150, min(800, n // 3))
    mask = [0] * prompt
    while len(mask) < n:
        sampled = rng.randint(20, 160)  # an assistant turn: trained
        tool = rng.randint(20, 320)  # a tool result and scaffolding: context
        mask += [1] * sampled + [0] * tool
    mask = mask[:n]
    ids = [rng.randrange(3, vocab) for _ in range(n)]
    logps = [-rng.expovariate(2.0) if m else 0.0 for m in mask]
    return TrainingSequence(ids, mask, logps, [f"n{len(ids)}"], AGENT)


def synthetic_rows(n_rollouts: int, vocab: int, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    rows: list[Row] = []
    for g in range(0, n_rollouts, GROUP):
        size = min(GROUP, n_rollouts - g)
        advantages, _ = group_advantages([float(rng.random() < 0.4) for _ in range(size)])
        for k, adv in enumerate(advantages):
            seqs = [synthetic_sequence(rng, vocab) for _ in range(rng.randint(1, 3))]
            rows += rollout_rows(seqs, adv, policy_version=0, rollout_id=f"r{g + k}", group_id=f"g{g}")
    return rows


def load_model(name: str, device: torch.device) -> torch.nn.Module:
    """The tiny model, or Qwen3-0.6B's architecture with random (seeded) weights; float32, on `device`."""
    if name == "tiny":
        model = load_causal_lm(tiny_model_path(), torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_0_6B), dtype=torch.float32)
    return model.to(device).train()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    model: torch.nn.Module, rows: list[Row], budget: int, layout: Layout, trainable_only: bool, bf16: bool
) -> dict[str, float]:
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    packing = pack_rows(rows, budget, layout=layout)
    pack_s = time.perf_counter() - start
    parts = []
    for mb in packing.microbatches:
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext():
            logp, ent = token_logprobs(model, mb, 1.0, trainable_only=trainable_only)
            loss, metrics = grpo_loss(logp, mb, normalizer=packing.loss_normalizer, config=LossConfig(), entropy=ent)
        loss.backward()
        parts.append(metrics)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    total = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {
        "tok_s": packing.real_tokens / total,
        "trained_tok_s": merge_metrics(parts)["num_tokens"] / total,
        "util": packing.utilization,
        "mbs": len(packing.microbatches),
        "pack_ms": pack_s * 1e3,
        "step_s": total,
        "peak_gib": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--budgets", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--no-compare", dest="compare", action="store_false")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--model", choices=["tiny", "qwen3-0.6b"], default="tiny")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast, as the trainer's bf16=True")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = load_model(args.model, device)
    rows = synthetic_rows(args.rollouts, model.config.vocab_size)
    n_tokens = sum(len(r) for r in rows)
    n_trained = sum(r.n_trainable for r in rows)
    print(
        f"os.cpu_count()={os.cpu_count()} torch threads={torch.get_num_threads()} torch {torch.__version__}; "
        f"{args.model} on {device}{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}"
        f"{', bf16 autocast' if args.bf16 else ''}; {args.rollouts} rollouts, {len(rows)} rows, {n_tokens} tokens, "
        f"{n_trained / n_tokens:.0%} trainable"
    )
    warm = pack_rows(rows[:2], max(args.budgets)).microbatches[0]  # first-call allocations, untimed
    with torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext():
        warm_loss = grpo_loss(token_logprobs(model, warm)[0], warm, normalizer=1.0)[0]
    warm_loss.backward()
    model.zero_grad(set_to_none=True)
    configs = [(b, "padded", True) for b in args.budgets]
    if args.compare:
        configs += [(args.budgets[0], "packed", True), (args.budgets[0], "padded", False)]
    print(
        f"{'budget':>7} {'layout':>7} {'logits':>9} {'mbs':>4} {'util':>6} {'pack ms':>8} {'step s':>7} "
        f"{'tok/s':>7} {'trained tok/s':>14} {'peak GiB':>9}"
    )
    for budget, layout, trainable_only in configs:
        r = run(model, rows, budget, layout, trainable_only, args.bf16)  # type: ignore[arg-type]
        print(
            f"{budget:>7} {layout:>7} {'trained' if trainable_only else 'all':>9} {r['mbs']:>4} {r['util']:>6.1%} "
            f"{r['pack_ms']:>8.1f} {r['step_s']:>7.1f} {r['tok_s']:>7.0f} {r['trained_tok_s']:>14.0f} "
            f"{r['peak_gib']:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
