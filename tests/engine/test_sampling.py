"""The sampled distribution and its processed logprobs, on synthetic logits."""

from __future__ import annotations

import math

import torch

from harness_grpo.engine.sampling import SamplingParams, choose, processed_logprobs

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def test_temperature_scales_before_log_softmax():
    (row,) = processed_logprobs(LOGITS, [SamplingParams(max_tokens=1, temperature=0.5)])
    assert torch.allclose(row, torch.log_softmax(LOGITS[0] / 0.5, dim=-1))
    (greedy,) = processed_logprobs(LOGITS, [SamplingParams(max_tokens=1, temperature=0.0)])
    assert torch.allclose(greedy, torch.log_softmax(LOGITS[0], dim=-1))


def test_top_k_and_top_p_renormalise_over_the_kept_tokens():
    (top_k,) = processed_logprobs(LOGITS, [SamplingParams(max_tokens=1, top_k=2)])
    assert torch.isinf(top_k[2:]).all()
    assert torch.allclose(top_k[:2], torch.log_softmax(LOGITS[0, :2], dim=-1))
    probs = torch.softmax(LOGITS[0], dim=-1)  # ~[0.55, 0.20, 0.12, 0.07, 0.03]
    (top_p,) = processed_logprobs(LOGITS, [SamplingParams(max_tokens=1, top_p=0.7)])
    assert torch.isinf(top_p[2:]).all()  # 0.55 < 0.7, then 0.75 >= 0.7: two tokens kept
    assert math.isclose(float(top_p[0]), math.log(probs[0] / probs[:2].sum()), rel_tol=1e-6)


def test_rows_are_processed_independently():
    logits = LOGITS.repeat(2, 1)
    params = [SamplingParams(max_tokens=1, temperature=2.0), SamplingParams(max_tokens=1, top_k=1)]
    rows = processed_logprobs(logits, params)
    assert torch.allclose(rows[0], torch.log_softmax(LOGITS[0] / 2.0, dim=-1))
    assert rows[1, 0] == 0 and torch.isinf(rows[1, 1:]).all()


def test_choose_is_seeded_and_never_picks_a_filtered_token():
    params = SamplingParams(max_tokens=1, top_k=3)
    (row,) = processed_logprobs(LOGITS, [params])
    draws = [choose(row, params, torch.Generator().manual_seed(s)) for s in range(300)]
    assert set(draws) == {0, 1, 2}
    assert draws == [choose(row, params, torch.Generator().manual_seed(s)) for s in range(300)]
    greedy = SamplingParams(max_tokens=1, temperature=0)
    assert choose(row, greedy, torch.Generator()) == 0
