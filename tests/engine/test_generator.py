"""The compute thread on its own: EOS handling, cancellation, failures, stop."""

from __future__ import annotations

import pytest
import torch

from harness_grpo.engine import EngineError, SamplingParams
from harness_grpo.engine.generator import Generator

EOS = 2  # <|im_end|> in the tiny tokenizer


class EosAfter(torch.nn.Module):
    """The tiny model, except that the token fed at position >= ``after`` is followed by EOS."""

    def __init__(self, model: torch.nn.Module, after: int) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config
        self.after = after

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        last_position = kwargs["position_ids"][:, -1]
        out.logits[:, -1, EOS] += torch.where(last_position >= self.after, 1e4, 0.0)
        return out


@pytest.fixture
def make_generator(reference_model, tokenizer):
    started = []

    def make(model: torch.nn.Module | None = None) -> Generator:
        generator = Generator(
            model or reference_model, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), {0, EOS}
        )
        generator.start()
        started.append(generator)
        return generator

    yield make
    for generator in started:
        generator.stop()


def test_eos_is_in_token_ids_but_not_in_text(make_generator, reference_model, tokenizer):
    prompt = tokenizer.encode("def f(x):")
    generator = make_generator(EosAfter(reference_model, after=len(prompt) + 3))
    done = generator.submit(prompt, SamplingParams(max_tokens=50, temperature=1.0, seed=0)).result(30)
    assert len(done.token_ids) == 5 and done.token_ids[-1] == EOS
    assert done.finish_reason == "stop" and done.stop_reason is None
    assert done.text == tokenizer.decode(done.token_ids[:-1], skip_special_tokens=True)
    assert done.logprobs[-1] > -1e-3


def test_ignore_eos_samples_on_to_max_tokens(make_generator, reference_model, tokenizer):
    prompt = tokenizer.encode("def f(x):")
    generator = make_generator(EosAfter(reference_model, after=len(prompt) + 3))
    done = generator.submit(prompt, SamplingParams(max_tokens=9, seed=0, ignore_eos=True)).result(30)
    assert len(done.token_ids) == 9 and done.token_ids[4:] == [EOS] * 5
    assert done.finish_reason == "length"


def test_cancelled_request_leaves_the_batch(make_generator, tokenizer):
    generator = make_generator()
    # Far more tokens than the compute thread can decode within the deadlines below: only the
    # cancellation can take this request out of the batch.
    long = generator.submit(tokenizer.encode("x"), SamplingParams(max_tokens=10**6, ignore_eos=True))
    short = generator.submit(tokenizer.encode("y"), SamplingParams(max_tokens=5, ignore_eos=True))
    assert short.result(30).finish_reason == "length"
    assert long.cancel()
    assert generator.submit(tokenizer.encode("z"), SamplingParams(max_tokens=3)).result(30).token_ids
    try:  # returns once no row is prefilling or decoding
        generator.pause(mode="wait", timeout_s=30)
    except EngineError as exc:
        pytest.fail(f"the cancelled request is still decoding: {exc}")


def test_a_failing_forward_fails_its_requests_and_the_loop_survives(make_generator, reference_model, tokenizer):
    class Flaky(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.config, self.fail = reference_model, reference_model.config, True

        def forward(self, **kwargs):
            if self.fail:
                raise RuntimeError("boom")
            return self.inner(**kwargs)

    flaky = Flaky()
    generator = make_generator(flaky)
    with pytest.raises(RuntimeError, match="boom"):
        generator.submit(tokenizer.encode("a"), SamplingParams(max_tokens=3)).result(30)
    flaky.fail = False
    assert (
        len(generator.submit(tokenizer.encode("a"), SamplingParams(max_tokens=3, ignore_eos=True)).result(30).token_ids)
        == 3
    )


def test_stop_fails_queued_requests_and_refuses_new_ones(make_generator, tokenizer):
    generator = make_generator()
    generator.pause()
    queued = generator.submit(tokenizer.encode("a"), SamplingParams(max_tokens=3))
    generator.stop()
    with pytest.raises(EngineError) as info:
        queued.result(5)
    assert info.value.status == 503
    with pytest.raises(EngineError):
        generator.submit(tokenizer.encode("a"), SamplingParams(max_tokens=3))


def test_on_token_sees_each_token_before_the_future_resolves(make_generator, tokenizer):
    generator = make_generator()
    seen: list[tuple[int, float, list[tuple[int, float]], bool]] = []
    futures = []

    def on_token(token_id: int, logprob: float, top: list[tuple[int, float]]) -> None:
        seen.append((token_id, logprob, top, futures[0].done()))

    params = SamplingParams(max_tokens=7, temperature=1.0, seed=4, top_logprobs=2, ignore_eos=True)
    generator.pause()  # so that the future is recorded before the first token
    futures.append(generator.submit(tokenizer.encode("def g():"), params, on_token))
    generator.resume()
    done = futures[0].result(30)
    assert [(t, lp, top) for t, lp, top, _ in seen] == list(
        zip(done.token_ids, done.logprobs, done.top_logprobs, strict=True)
    )
    assert not any(resolved for *_, resolved in seen)
    plain = generator.submit(tokenizer.encode("def g():"), params).result(30)
    assert plain.token_ids == done.token_ids


def test_a_raising_on_token_fails_only_its_sequence(make_generator, tokenizer):
    generator = make_generator()

    def broken(*_: object) -> None:
        raise RuntimeError("consumer gone")

    params = SamplingParams(max_tokens=5, ignore_eos=True)
    failing = generator.submit(tokenizer.encode("a"), params, broken)
    healthy = generator.submit(tokenizer.encode("b"), params, lambda *_: None)
    with pytest.raises(RuntimeError, match="consumer gone"):
        failing.result(30)
    assert len(healthy.result(30).token_ids) == 5
    generator.pause(mode="wait", timeout_s=30)  # nothing left decoding
