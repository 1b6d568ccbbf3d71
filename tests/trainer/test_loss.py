"""Loss: a hand-computed value, clipping, importance sampling, gradients, and logprob alignment."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness_grpo.loss import LossConfig, grpo_loss, merge_metrics, token_logprobs
from harness_grpo.packing import Layout, MicroBatch, pack_rows
from harness_grpo.rows import Row, rollout_rows
from harness_grpo.tiny_model import tiny_model_path
from proxy.capture_graph import AGENT, TrainingSequence
from tests.support.rows import random_rows


def place(batch: MicroBatch, per_row: list[list[float]]) -> torch.Tensor:
    """Per-row values into the batch layout (0.0 elsewhere)."""
    out = torch.zeros(batch.input_ids.shape)
    for b, segs in enumerate(batch.segments):
        for i, start, n in segs:
            out[b, start : start + n] = torch.tensor(per_row[i])
    return out


def two_rows() -> list[Row]:
    # per-rollout weighting; rollout r1: one row, trained tokens at positions 1 and 2, A = +1 -> weight 1/2 per token
    # rollout r2: one row, trained token at position 2 only (positions 1 and 3 are context), A = -0.5 -> weight 1
    s1 = TrainingSequence([5, 6, 7], [0, 1, 1], [0.0, -1.0, -2.0], ["a"], AGENT)
    s2 = TrainingSequence([5, 8, 9, 4], [0, 0, 1, 0], [0.0, 0.0, -0.5, 0.0], ["b"], AGENT)
    r1 = rollout_rows([s1], 1.0, policy_version=0, rollout_id="r1", group_id="g", weighting="rollout")
    r2 = rollout_rows([s2], -0.5, policy_version=0, rollout_id="r2", group_id="g", weighting="rollout")
    return r1 + r2


# trainer logprobs per row (only trained positions matter; the others are deliberately wild)
TRAINER = [[3.0, -0.9, -1.5], [7.0, -20.0, -1.0, 9.0]]


def test_hand_computed_loss_and_clipping() -> None:
    rows = two_rows()
    packing = pack_rows(rows, 64)
    (batch,) = packing.microbatches
    assert packing.loss_normalizer == 2.0  # two rollouts
    logp = place(batch, TRAINER).requires_grad_(True)
    loss, metrics = grpo_loss(logp, batch, normalizer=packing.loss_normalizer, config=LossConfig(epsilon=0.2))

    # token 1 (row 1, A=+1): r = e^(-0.9+1.0) = 1.10517, inside [0.8, 1.2]      -> l = -1.10517
    # token 2 (row 1, A=+1): r = e^(-1.5+2.0) = 1.64872 > 1.2, min(1.6487, 1.2)  -> l = -1.2   (high clip)
    # token 3 (row 2, A=-0.5): r = e^(-1.0+0.5) = 0.60653 < 0.8,
    #          min(0.60653 * -0.5, 0.8 * -0.5) = min(-0.30327, -0.4)            -> l = +0.4   (low clip)
    l1 = -math.exp(0.1) * 1.0
    l2 = -1.2 * 1.0
    l3 = -min(math.exp(-0.5) * -0.5, 0.8 * -0.5)
    expected = (0.5 * l1 + 0.5 * l2 + 1.0 * l3) / 2.0
    assert expected == pytest.approx(-0.3762927, abs=1e-6)
    assert loss.item() == pytest.approx(expected, abs=1e-6)

    assert metrics["num_tokens"] == 3
    assert metrics["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(2 / 3)
    assert metrics["ratio"] == pytest.approx((math.exp(0.1) + math.exp(0.5) + math.exp(-0.5)) / 3, rel=1e-6)

    # gradients: only trained tokens; the clipped tokens have none; token 1: d/dlogp = -A r w / N
    loss.backward()
    grad = logp.grad
    assert grad is not None
    expected_grad = [[0.0, -math.exp(0.1) * 0.5 / 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert torch.allclose(grad, place(batch, expected_grad), atol=1e-7)


def test_decoupled_anchor_and_token_tis() -> None:
    rows = two_rows()
    packing = pack_rows(rows, 64)
    (batch,) = packing.microbatches
    # pi_old: token 1 as behaviour (rho = 1), token 2 rho = e^(ln 3) = 3 > cap 2, token 3 rho = e^(-1) = 0.3679
    old = place(batch, [[0.0, -1.0, -2.0 + math.log(3.0)], [0.0, 0.0, -1.5, 0.0]])
    logp = place(batch, [[0.0, -1.0, -2.0 + math.log(3.0)], [0.0, 0.0, -1.5, 0.0]]).requires_grad_(True)
    cfg = LossConfig(importance_sampling="token_tis", is_cap=2.0)
    loss, m = grpo_loss(logp, batch, normalizer=2.0, config=cfg, old_logprobs=old)
    # r = 1 everywhere (logp == old): l = -A * w_is; w_is = [1, min(3, 2), e^-1]
    expected = (0.5 * -1.0 * 1.0 + 0.5 * -1.0 * 2.0 + 1.0 * 0.5 * math.exp(-1.0)) / 2.0
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["mismatch/tis_clipped_frac"] == pytest.approx(1 / 3)
    assert m["mismatch/ratio_max"] == pytest.approx(3.0, rel=1e-6)
    assert m["mismatch/ratio_mean"] == pytest.approx((1 + 3 + math.exp(-1)) / 3, rel=1e-6)
    k3 = [0.0, 3 - 1 - math.log(3), math.exp(-1) - 1 + 1]
    assert m["mismatch/kl"] == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert m["clip_ratio/region_mean"] == 0.0

    # token_mask: tokens with rho outside [1/2, 2] (tokens 2 and 3) are dropped
    loss, m = grpo_loss(
        logp, batch, normalizer=2.0, config=LossConfig(importance_sampling="token_mask"), old_logprobs=old
    )
    assert loss.item() == pytest.approx((0.5 * -1.0) / 2.0, abs=1e-6)
    assert m["mismatch/tis_clipped_frac"] == pytest.approx(2 / 3)

    # old_logprobs None: the current logprobs (detached) stand in for pi_old; same value and gradient
    loss_none, _ = grpo_loss(logp, batch, normalizer=2.0, config=cfg)
    assert loss_none.item() == pytest.approx(expected, abs=1e-6)

    # "off" with old_logprobs None anchors on behaviour: r = rho, clipped (AsyncGRPO)
    loss_off, m = grpo_loss(logp, batch, normalizer=2.0)
    lt = [-min(1.0, 1.0), -min(3.0, 1.2), -min(math.exp(-1) * -0.5, 0.8 * -0.5)]
    assert loss_off.item() == pytest.approx((0.5 * lt[0] + 0.5 * lt[1] + lt[2]) / 2.0, abs=1e-6)
    assert m["mismatch/tis_clipped_frac"] == pytest.approx(1 / 3)  # what token_tis would clip


def test_kl_to_reference() -> None:
    rows = two_rows()
    (batch,) = pack_rows(rows, 64).microbatches
    logp = place(batch, [[0.0, -1.0, -2.0], [0.0, 0.0, -0.5, 0.0]]).requires_grad_(True)
    ref = place(batch, [[0.0, -1.5, -2.0], [0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, batch, normalizer=2.0, config=LossConfig(beta=0.1))
    loss, m = grpo_loss(logp, batch, normalizer=2.0, config=LossConfig(beta=0.1), ref_logprobs=ref)
    k3 = [math.exp(-0.5) + 0.5 - 1, 0.0, math.exp(0.5) - 0.5 - 1]
    policy = (0.5 * -1.0 + 0.5 * -1.0 + 1.0 * 0.5) / 2.0
    expected = policy + 0.1 * (0.5 * k3[0] + 0.5 * k3[1] + 1.0 * k3[2]) / 2.0
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["kl"] == pytest.approx(sum(k3) / 3, rel=1e-6)


def test_top_entropy_quantile_keeps_the_policy_gradient_of_the_high_entropy_tokens_only() -> None:
    rows = two_rows()
    packing = pack_rows(rows, 64)
    (batch,) = packing.microbatches
    entropy = place(batch, [[0.0, 0.1, 2.0], [0.0, 0.0, 1.0, 0.0]])  # trained tokens: 0.1, 2.0 and 1.0
    logp = batch.behaviour_logprobs.clone().requires_grad_(True)  # ratio 1: no clipping, d loss / d logp = -A w / N
    config = LossConfig(top_entropy_quantile=0.5, beta=0.1)
    loss, metrics = grpo_loss(
        logp, batch, normalizer=packing.loss_normalizer, config=config, ref_logprobs=logp.detach(), entropy=entropy
    )
    loss.backward()
    assert logp.grad is not None
    row1, row2 = (next(b for b, segs in enumerate(batch.segments) if segs[0][0] == i) for i in (0, 1))
    start1, start2 = batch.segments[row1][0][1], batch.segments[row2][0][1]
    assert logp.grad[row1, start1 + 1].item() == 0.0  # entropy 0.1, below the median 1.0: dropped (ref = policy: no KL)
    assert logp.grad[row1, start1 + 2].item() == pytest.approx(-0.25)  # entropy 2.0 kept: A 1, weight 1/2, N 2
    assert logp.grad[row2, start2 + 2].item() == pytest.approx(0.25)  # entropy 1.0 kept: A -0.5, weight 1, N 2
    assert metrics["entropy/kept_frac"] == pytest.approx(2 / 3)
    all_kept, _ = grpo_loss(logp, batch, normalizer=packing.loss_normalizer, config=LossConfig(), entropy=entropy)
    assert loss.item() == pytest.approx(all_kept.item() + 0.25)  # the dropped token's term, -1 * 1/2 / 2
    with pytest.raises(ValueError, match="top_entropy_quantile must be in"):
        LossConfig(top_entropy_quantile=1.5)
    with pytest.raises(ValueError, match="needs the entropy"):
        grpo_loss(logp, batch, normalizer=2.0, config=LossConfig(top_entropy_quantile=0.2))


def test_masked_positions_never_produce_nan() -> None:
    (batch,) = pack_rows(two_rows(), 64).microbatches
    logp = place(batch, [[500.0, -1.0, -2.0], [0.0, 800.0, -0.5, -900.0]]).requires_grad_(True)
    loss, _ = grpo_loss(logp, batch, normalizer=2.0, config=LossConfig(importance_sampling="token_tis"))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()  # type: ignore[union-attr]


def test_merge_metrics() -> None:
    a = {"ratio": 1.0, "mismatch/ratio_max": 2.0, "num_tokens": 1.0}
    b = {"ratio": 2.0, "mismatch/ratio_max": 1.5, "num_tokens": 3.0, "entropy": 4.0}
    assert merge_metrics([a, b]) == {"ratio": 1.75, "mismatch/ratio_max": 2.0, "num_tokens": 4.0, "entropy": 4.0}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32).eval()


def test_token_logprobs_alignment_matches_manual_log_softmax(model: torch.nn.Module) -> None:
    rows = random_rows(k=1, seed=3)
    (batch,) = pack_rows(rows, 512).microbatches
    ids = batch.input_ids[0]
    temperature = 0.7
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float()
        # the logprob of ids[t] comes from the logits at t-1; position 0 has none (0.0)
        manual = torch.zeros(len(ids))
        manual[1:] = torch.log_softmax(logits[:-1] / temperature, -1)[torch.arange(len(ids) - 1), ids[1:]]
        for t in (1, 2, len(ids) - 1):  # the same, written out per position
            assert manual[t] == torch.log_softmax(logits[t - 1] / temperature, -1)[ids[t]]
        p = torch.softmax(logits / temperature, -1)
        ent = torch.cat([torch.zeros(1), -(p * torch.log(p)).sum(-1)[:-1]])
        full, full_ent = token_logprobs(model, batch, temperature, trainable_only=False)
        sel, sel_ent = token_logprobs(model, batch, temperature)
    assert torch.allclose(full[0], manual, atol=1e-5) and full[0, 0] == 0.0
    assert torch.allclose(full_ent[0], ent, atol=1e-4)
    trained = batch.loss_mask[0] > 0
    assert torch.allclose(sel[0][trained], manual[trained], atol=1e-5)
    assert torch.allclose(sel_ent[0][trained], ent[trained], atol=1e-4)
    assert torch.all(sel[0][~trained] == 0) and torch.all(sel_ent[0][~trained] == 0)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_batched_logprobs_equal_single_row_logprobs(model: torch.nn.Module, layout: Layout) -> None:
    rows = random_rows(k=5, seed=7)
    packing = pack_rows(rows, 2048, layout=layout)
    (batch,) = packing.microbatches
    assert batch.input_ids.shape[0] == (len(rows) if layout == "padded" else 1)
    with torch.no_grad():
        batched = {t: token_logprobs(model, batch, 1.0, trainable_only=t)[0] for t in (True, False)}
        for i, row in enumerate(rows):
            (single,) = pack_rows([row], 2048).microbatches
            alone = token_logprobs(model, single, 1.0, trainable_only=False)[0][0]
            ((b, start, n),) = [(b, s, n) for b, segs in enumerate(batch.segments) for j, s, n in segs if j == i]
            mask = torch.tensor(row.loss_mask, dtype=torch.bool)
            assert torch.allclose(batched[False][b, start + 1 : start + n], alone[1:], atol=1e-5)
            assert torch.allclose(batched[True][b, start : start + n][mask], alone[mask], atol=1e-5)


def test_model_gradient_ignores_untrained_tokens(model: torch.nn.Module) -> None:
    """Changing what is not trained (a context token after the last trained one, behaviour logprobs
    under mask 0) changes neither the loss nor any parameter gradient."""

    def step(ids: list[int], logps: list[float]) -> tuple[float, list[torch.Tensor], dict[str, float]]:
        row = Row(ids, [0, 0, 1, 0, 1, 0], logps, 1.0, 0.5, 0, "r", "g")
        (batch,) = pack_rows([row], 64).microbatches
        model.zero_grad()
        logp, ent = token_logprobs(model, batch, 1.0)
        loss, m = grpo_loss(logp, batch, normalizer=1.0, entropy=ent)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        return loss.item(), grads, m

    loss_a, grads_a, m = step([1, 2, 3, 4, 5, 6], [0.0, 0.0, -9.0, 0.0, -9.0, 0.0])
    loss_b, grads_b, _ = step([1, 2, 3, 4, 5, 77], [0.0, -3.0, -9.0, -4.0, -9.0, -5.0])
    assert loss_a == loss_b and len(grads_a) == len(grads_b) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    assert any(bool(g.abs().sum() > 0) for g in grads_a)
    assert m["entropy"] > 0 and m["num_tokens"] == 2
