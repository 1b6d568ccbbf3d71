"""The GRPO loss: a per-token clipped surrogate on captured tokens, with token-level importance sampling.

Alignment. `token_logprobs` returns logprobs[b, t] = log softmax(logits[b, t-1] / T)[input_ids[b, t]]:
the logprob of the token AT position t, predicted from the logits at t-1, in float32 — the same
quantity and the same index as the engine's behaviour logprob of a sampled token (vLLM returns
processed logprobs, log_softmax(logits / T)). Position 0 has no predictor and is 0.0.

Per trained token t of a row with advantage A (eps_high defaults to eps):

    r_t   = exp(logp_t - anchor_t)                              trust-region ratio
    l_t   = -min(r_t * A, clip(r_t, 1 - eps, 1 + eps_high) * A) * is_t  +  beta * k3(ref_t, logp_t)
    L     = sum_rows weight * sum_t mask_t * l_t / normalizer

`weight` and `normalizer` come from `harness_grpo.rows` (default: every trained token of the step
weighs the same and L is their mean; `loss_weighting="rollout"`: each rollout counts once). The
normalizer is the whole optimizer step's, so micro-batch losses are summed, never averaged (no 1/GA
factor). Under data parallelism every rank
uses the global normalizer and multiplies its loss by the world size, since DDP/FSDP average
gradients over ranks (``harness_grpo.distributed.loss_scale``).

Anchor and importance sampling (`LossConfig.importance_sampling`, REFERENCE §6.17–20):
  * "off", `old_logprobs` None (AsyncGRPO's default): anchor = the engine's behaviour logprobs,
    is_t = 1. The clip then mixes policy drift with trainer/engine numerical mismatch.
  * "off", `old_logprobs` given: anchor = old_logprobs, is_t = 1 (plain PPO; mismatch ignored).
  * "token_tis" / "token_mask" (decoupled): anchor = old_logprobs, the trainer's own logprobs of
    the data at the start of the step (pi_old, detached), and rho_t = exp(old_t - behaviour_t)
    corrects the engine/trainer mismatch (and staleness) token by token:
      token_tis:  is_t = min(rho_t, cap)                     (truncated IS, cap default 2)
      token_mask: is_t = 1 if 1/cap <= rho_t <= cap else 0   (icepop-style mask, [0.5, 2] at cap 2)
    A `floor` (TRL's `vllm_importance_sampling_clip_min`) replaces the lower bound: token_tis clips
    rho_t up to it, token_mask keeps [floor, cap] (floor 0: only the cap, TRL's token_mask default).
    `cap` may be inf (no upper bound).
    When `old_logprobs` is None the current logprobs, detached, stand in for pi_old. That is exact
    when each batch is used for one optimizer step (the weights have not moved since the engine
    version was synced, so the first forward IS pi_old) and saves a forward pass; pass
    `old_logprobs` explicitly when one batch feeds several optimizer steps.
  Sequence-level IS is deliberately absent (a product over hundreds of tokens overflows, §6.18).

High-entropy tokens only (`LossConfig.top_entropy_quantile` rho < 1, TRL's name, from "Beyond the 80/20
Rule"): the surrogate term keeps only the trained tokens whose entropy is at or above the (1 - rho)
quantile of the micro-batch's trained tokens (TRL takes its quantile per forward batch too); the others
contribute no policy gradient but still count in the normalizer, and the KL term keeps them all. Where
a policy has all but decided (a tool call's syntax after a format SFT), such tokens carry only noise,
which an adaptive optimizer amplifies; the decisions are the high-entropy few. Metric:
`entropy/kept_frac`.

KL to a reference (beta > 0 only; `ref_logprobs` aligned like `logprobs`): the k3 estimator
exp(ref - logp) - (ref - logp) - 1. Not importance-weighted. At beta = 0 no reference is needed.

Metrics (plain means over the micro-batch's trained tokens, not rollout-weighted; `merge_metrics`
combines micro-batches by token count):
  ratio, clip_ratio/low_mean (r < 1-eps and A < 0), clip_ratio/high_mean (r > 1+eps_high and A > 0),
  clip_ratio/region_mean (either), entropy (of the temperature-scaled distribution), kl (beta > 0),
  mismatch/kl (k3 estimate of KL(engine || trainer) from engine samples: rho - 1 - log rho, with
  rho = exp(trainer - behaviour); trainer = old_logprobs, else the current logprobs),
  mismatch/ratio_mean, mismatch/ratio_max, mismatch/tis_clipped_frac (tokens whose IS weight the
  correction changed: rho > cap for token_tis and "off" — there, what it would clip —, rho outside
  [1/cap, cap] for token_mask, below the floor too when one is set), num_tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from harness_grpo.packing import MicroBatch

__all__ = ["ImportanceSampling", "LossConfig", "grpo_loss", "high_entropy_mask", "merge_metrics", "token_logprobs"]

ImportanceSampling = Literal["token_tis", "token_mask", "off"]


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Loss settings (TRL names: `epsilon`, `epsilon_high`, `beta`)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    importance_sampling: ImportanceSampling = "off"
    is_cap: float = 2.0
    beta: float = 0.0
    is_floor: float | None = None  # None: none for token_tis, 1/is_cap for token_mask
    top_entropy_quantile: float = 1.0

    def __post_init__(self) -> None:
        if self.importance_sampling not in ("token_tis", "token_mask", "off"):
            raise ValueError(f"importance_sampling must be token_tis, token_mask or off: {self.importance_sampling!r}")
        if not self.is_cap > 1.0:
            raise ValueError("is_cap must be > 1")
        if self.is_floor is not None and not 0.0 <= self.is_floor < self.is_cap:
            raise ValueError("is_floor must be >= 0 and below is_cap")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0) or self.beta < 0:
            raise ValueError("epsilon, epsilon_high and beta must be >= 0")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], not {self.top_entropy_quantile}")


def _output_layer(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", model)  # DDP and similar wrappers
    get = getattr(inner, "get_output_embeddings", None)
    layer = get() if get is not None else None
    if layer is None:
        raise ValueError("trainable_only needs a model with get_output_embeddings(); pass trainable_only=False")
    return layer


@contextmanager
def _project_only(layer: nn.Module, index: tuple[torch.Tensor, torch.Tensor]) -> Iterator[None]:
    """Make `layer` (the LM head) see hidden[index] (N, H) instead of hidden (B, L, H).

    The model's own forward still runs end to end (wrappers, sharding hooks and any elementwise
    logit processing such as soft-capping stay in effect); only the vocabulary projection shrinks
    to the positions that predict a trained token.
    """

    def hook(module: nn.Module, args: tuple) -> tuple:
        return (args[0][index], *args[1:])

    handle = layer.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _logprob_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits.float() / temperature
    log_z = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    with torch.no_grad():
        entropy = log_z - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def token_logprobs(
    model: nn.Module, batch: MicroBatch, temperature: float = 1.0, *, trainable_only: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy), both (B, L) float32; logprobs[b, t] is the logprob of input_ids[b, t].

    The model gets `input_ids` and `position_ids`, no attention mask and no cache (see
    `harness_grpo.packing` for why that is exact in both layouts). With `trainable_only` (default)
    the vocabulary projection runs only at the positions t-1 that predict a trained token t; the
    others are 0.0 in both outputs. Entropy is detached (a metric). Logprobs carry gradients when
    grad is enabled.
    """
    if not temperature > 0:
        raise ValueError("temperature must be > 0")
    ids = batch.input_ids
    device = next(model.parameters()).device
    inputs = {"input_ids": ids.to(device), "position_ids": batch.position_ids.to(device), "use_cache": False}
    logprobs = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    entropy = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    if trainable_only:
        b_idx, t_idx = (batch.loss_mask > 0).nonzero(as_tuple=True)
        if bool((t_idx == 0).any()):
            raise ValueError("a trained token at position 0 has no predicting logit")
        b_idx, t_idx = b_idx.to(device), t_idx.to(device)
        with _project_only(_output_layer(model), (b_idx, t_idx - 1)):
            logits = model(**inputs).logits
        if logits.shape[:-1] != b_idx.shape:
            raise RuntimeError(f"selected logits have shape {tuple(logits.shape)}; expected ({len(b_idx)}, vocab)")
        lp, ent = _logprob_entropy(logits, inputs["input_ids"][b_idx, t_idx], temperature)
        logprobs = logprobs.index_put((b_idx, t_idx), lp)
        entropy[b_idx, t_idx] = ent
    else:
        logits = model(**inputs).logits[:, :-1]
        lp, ent = _logprob_entropy(logits, inputs["input_ids"][:, 1:], temperature)
        logprobs = torch.cat([logprobs[:, :1], lp], dim=1)
        entropy[:, 1:] = ent
    return logprobs, entropy


def grpo_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    *,
    normalizer: float,
    config: LossConfig = LossConfig(),
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of one micro-batch; summing the losses of a step's micro-batches gives L.

    All tensors are (B, L) and aligned with `batch` (see `token_logprobs`). Only trained tokens
    (loss_mask 1) contribute values or gradients; `old_logprobs` and `ref_logprobs` are detached.
    """
    if not normalizer > 0:
        raise ValueError("normalizer must be > 0 (loss_normalizer of the step's rows)")
    if config.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    if config.top_entropy_quantile < 1.0 and entropy is None:
        raise ValueError("top_entropy_quantile < 1 needs the entropy token_logprobs returns")
    device = logprobs.device
    trained = batch.loss_mask.to(device) > 0
    mask = trained.float()
    behaviour = batch.behaviour_logprobs.to(device)
    adv = batch.advantages.to(device)
    weights = batch.weights.to(device)
    zero = torch.zeros_like(logprobs)
    eps_low = config.epsilon
    eps_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    cap = config.is_cap

    trainer = (old_logprobs if old_logprobs is not None else logprobs).detach()
    log_rho = torch.where(trained, trainer - behaviour, zero)
    rho = torch.exp(log_rho)
    if config.importance_sampling == "off":
        anchor = trainer if old_logprobs is not None else behaviour
        is_weight = None
        is_changed = rho > cap
    else:
        anchor = trainer
        if config.importance_sampling == "token_tis":
            floor = config.is_floor
            is_weight = rho.clamp(min=floor, max=cap)
            is_changed = (rho > cap) if floor is None else (rho > cap) | (rho < floor)
        else:
            floor = 1.0 / cap if config.is_floor is None else config.is_floor
            is_changed = (rho < floor) | (rho > cap)
            is_weight = (~is_changed).float()

    ratio = torch.exp(torch.where(trained, logprobs - anchor, zero))
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kept = None
    if config.top_entropy_quantile < 1.0:
        assert entropy is not None
        kept = high_entropy_mask(entropy.to(device), trained, config.top_entropy_quantile)
        per_token = per_token * kept
    if is_weight is not None:
        per_token = per_token * is_weight
    if config.beta > 0:
        assert ref_logprobs is not None
        log_ref_ratio = torch.where(trained, ref_logprobs.detach().to(device) - logprobs, zero)
        k3 = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
        per_token = per_token + config.beta * k3
    loss = (per_token * weights * mask).sum() / normalizer

    with torch.no_grad():
        n = int(mask.sum().item())

        def mean(x: torch.Tensor) -> float:
            return float((x.float() * mask).sum().item() / n) if n else 0.0

        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        metrics = {
            "ratio": mean(ratio),
            "clip_ratio/low_mean": mean(low),
            "clip_ratio/high_mean": mean(high),
            "clip_ratio/region_mean": mean(low | high),
            "mismatch/kl": mean(rho - 1.0 - log_rho),
            "mismatch/ratio_mean": mean(rho),
            "mismatch/ratio_max": float(rho[trained].max().item()) if n else 0.0,
            "mismatch/tis_clipped_frac": mean(is_changed),
            "num_tokens": float(n),
        }
        if entropy is not None:
            metrics["entropy"] = mean(entropy.to(device))
        if config.beta > 0:
            metrics["kl"] = mean(k3)
        if kept is not None:
            metrics["entropy/kept_frac"] = mean(kept)
    return loss, metrics


def high_entropy_mask(entropy: torch.Tensor, trained: torch.Tensor, quantile: float) -> torch.Tensor:
    """Float mask, 1.0 on the trained tokens whose entropy is at or above the ``1 - quantile`` quantile of the
    trained tokens' entropies (TRL's ``get_high_entropy_mask``, over this tensor's tokens); 0.0 elsewhere."""
    values = entropy[trained].float()
    if values.numel() == 0:
        return torch.zeros_like(entropy)
    threshold = torch.quantile(values, 1.0 - quantile)
    return ((entropy >= threshold) & trained).float()


def merge_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Combine micro-batch metrics: token-weighted means, max of `*_max`, summed `num_tokens`."""
    total = sum(p["num_tokens"] for p in parts)
    merged: dict[str, float] = {"num_tokens": total}
    for key in {k for p in parts for k in p} - {"num_tokens"}:
        values = [(p[key], p["num_tokens"]) for p in parts if key in p and p["num_tokens"] > 0]
        if key.endswith("_max"):
            merged[key] = max((v for v, _ in values), default=0.0)
        else:
            weight = sum(n for _, n in values)
            merged[key] = math.fsum(v * n for v, n in values) / weight if weight else 0.0
    return merged
