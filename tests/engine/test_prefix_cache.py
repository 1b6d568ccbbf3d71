"""Prefix caching: a multi-turn conversation prefills only what each call adds, samples what a cold engine
samples, and never reuses a KV across a weight update."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest
import torch

from harness_grpo.engine import EmbeddedEngine, SamplingParams
from harness_grpo.engine.prefix_cache import PrefixCache

SYSTEM = "You move a paddle under a falling ball. Answer left, right or stay. " * 8


def _layers(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, 2, n, 4), fill), torch.full((1, 2, n, 4), fill)) for _ in range(2)]


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _conversation(engine: EmbeddedEngine, turns: int) -> list[tuple[list[int], list[int], list[float]]]:
    """``turns`` calls, each resending the history with the last reply and a new user message."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "The ball is left."}]
    calls = []
    for turn in range(turns):
        prompt = engine.render_chat(messages)
        done = engine.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=turn))
        calls.append((prompt, done.token_ids, done.logprobs))
        messages += [{"role": "assistant", "content": done.text}, {"role": "user", "content": f"Row {turn}."}]
    return calls


@pytest.fixture
def engines(tiny_path: Path):
    started = []

    def make(**kwargs) -> EmbeddedEngine:
        started.append(EmbeddedEngine(tiny_path, **kwargs).start())
        return started[-1]

    yield make
    for engine in started:
        engine.stop()


def test_later_turns_prefill_only_what_they_add_and_sample_as_a_cold_engine(engines):
    cold, cached = engines(), engines(enable_prefix_caching=True)
    expected, got = _conversation(cold, 6), _conversation(cached, 6)

    for (prompt, tokens, logprobs), (prompt_c, tokens_c, logprobs_c) in zip(expected, got, strict=True):
        assert prompt_c == prompt and tokens_c == tokens
        assert torch.allclose(torch.tensor(logprobs_c), torch.tensor(logprobs), atol=1e-4)
    stats = cached.prefix_cache.stats
    assert stats.hits == 5  # every call after the first
    # Each later call reuses what it shares with its previous call's prompt and sampled ids (the last id
    # never fed; the template may render a reply with other ids than were sampled).
    assert stats.reused_tokens == sum(
        _common(before + tokens[:-1], after) for (before, tokens, _), (after, _, _) in itertools.pairwise(expected)
    )
    assert stats.reused_tokens > 0.7 * sum(len(prompt) for prompt, _, _ in expected[1:])
    assert cached.stats.prefill_tokens == cold.stats.prefill_tokens - stats.reused_tokens
    assert len(cached.prefix_cache) <= 6


def test_a_weight_update_drops_the_cache(engines, reference_model):
    cached = engines(enable_prefix_caching=True)
    _conversation(cached, 2)
    assert len(cached.prefix_cache) > 0
    changed = {name: tensor + 0.01 for name, tensor in reference_model.state_dict().items() if "mlp" in name}

    cached.update_weights(changed)

    assert len(cached.prefix_cache) == 0
    hits = cached.prefix_cache.stats.hits
    after = _conversation(cached, 1)
    assert cached.prefix_cache.stats.hits == hits  # nothing computed under the old weights is reused
    cold = engines()
    cold.update_weights(changed)
    assert after == _conversation(cold, 1)


def test_a_sequence_in_flight_across_a_reset_is_not_stored(engines, tokenizer):
    engine = engines(enable_prefix_caching=True)
    generator = engine._generator
    sampled = threading.Event()
    prompt = tokenizer.encode(SYSTEM)
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=0, ignore_eos=True)
    future = engine.submit(prompt, params, on_token=lambda *_: sampled.set())
    assert sampled.wait(30)

    generator.call(generator.reset_prefix_cache, 30)  # as a weight update does, mid-sequence

    assert len(future.result(30).token_ids) == 64
    assert len(engine.prefix_cache) == 0
    engine.generate(prompt, params)  # admitted after the reset: stored
    assert len(engine.prefix_cache) == 1


def test_lookup_answers_the_longest_prefix_leaving_the_last_prompt_id_to_run():
    cache = PrefixCache(max_bytes=1 << 20, min_tokens=4)
    cache.store(list(range(10)), _layers(10, 1.0))
    cache.store([0, 1, 2, 3, 4, 5, 99, 98], _layers(8, 2.0))

    length, layers = cache.lookup([0, 1, 2, 3, 4, 5, 6, 7, 50])
    assert length == 8 and layers[0][0].shape == (1, 2, 8, 4) and float(layers[0][0][0, 0, 0, 0]) == 1.0
    assert cache.lookup(list(range(10)))[0] == 9  # a repeated prompt still runs its last id
    assert cache.lookup([0, 1, 2, 7, 7]) is None  # 3 common ids: under min_tokens
    assert cache.lookup([5, 6, 7, 8, 9]) is None
    assert cache.stats.hits == 2 and cache.stats.reused_tokens == 17


def test_an_extending_sequence_replaces_its_prefix_and_the_oldest_entries_go_past_the_budget():
    per_entry = sum(k.nbytes + v.nbytes for k, v in _layers(8))
    cache = PrefixCache(max_bytes=2 * per_entry + per_entry // 2, min_tokens=4)
    cache.store(list(range(8)), _layers(8))
    cache.store([3] * 8, _layers(8))
    cache.store(list(range(6)), _layers(6))  # inside the first entry: nothing new to keep
    assert len(cache) == 2
    cache.store(list(range(9)), _layers(9))  # extends the first: replaces it
    assert len(cache) == 2 and cache.lookup([*list(range(9)), 1])[0] == 9

    cache.lookup([3] * 9)  # the second entry is now the most recently used
    cache.store([7] * 8, _layers(8))
    assert cache.stats.evictions == 1 and cache.nbytes <= cache.max_bytes
    assert cache.lookup([*list(range(9)), 1]) is None  # the least recently used went
    assert cache.lookup([7] * 9)[0] == 8
    cache.store(list(range(100)), _layers(100))  # larger than the whole budget: not kept
    assert cache.lookup(list(range(101))) is None
