"""The distribution a request samples from, and its processed logprobs.

Contract: ``processed_logprobs`` returns, per row, the log-probabilities of the
distribution that ``choose`` samples from: ``log_softmax(logits / T)`` after
top-k and top-p filtering (filtered tokens get ``-inf``), as vLLM's
``--logprobs-mode processed_logprobs``. Greedy rows (``T == 0``) get plain
``log_softmax(logits)`` and take the argmax. Sampling draws from a per-request
``torch.Generator`` with the exponential race (argmax of ``p / E`` with ``E ~ Exp(1)``), so a
seeded request gives the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping settings.

    ``top_k`` of -1 or 0 and ``top_p`` of 1 disable those filters. ``stop``
    strings end generation and are cut from the text; ``top_logprobs`` is how
    many alternatives to report per position (0: only the sampled token);
    ``ignore_eos`` samples on past end-of-sequence tokens until ``max_tokens``.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def filtered(self) -> bool:
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)


def _filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``row`` (scaled logits) with tokens outside the top-k / nucleus set to ``-inf``."""
    if 0 < top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        remove_sorted = mass_before >= top_p
        remove_sorted[0] = False
        row = row.masked_fill(torch.zeros_like(remove_sorted).scatter(0, order, remove_sorted), float("-inf"))
    return row


def processed_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """``[B, V]`` float32 logprobs of the distribution each row samples from."""
    temperatures = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=torch.float32)
    scaled = logits.float() / temperatures[:, None]
    for row, p in enumerate(params):
        if p.filtered:
            scaled[row] = _filter_top_k_top_p(scaled[row], p.top_k, p.top_p)
    return torch.log_softmax(scaled, dim=-1)


def choose(logprobs: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token sampled from one row of ``processed_logprobs`` (argmax when greedy)."""
    if params.greedy:
        return int(torch.argmax(logprobs))
    # Exp(1) noise as -log(U): ~5x faster on CPU than ``exponential_``. U = 0 gives infinite noise,
    # which can only make a token lose the race, so filtered (-inf) tokens are never picked.
    noise = torch.rand(logprobs.shape, generator=generator).log_().neg_()
    return int(torch.argmax(logprobs - noise.log_()))
