"""Iteration-level batching on one compute thread.

Contract: ``Generator.submit(prompt_ids, params)`` returns a
``concurrent.futures.Future`` that resolves to a ``Completion`` (or an
exception); any thread, or an asyncio loop via ``asyncio.wrap_future``, may
wait on it, and cancelling it drops the sequence at the next iteration. With
``on_token``, the compute thread also calls ``on_token(token_id, logprob,
top_logprobs)`` for each sampled token, in order, as soon as it is sampled and
before the future resolves (streaming). The callback must return at once and
never wait on its consumer (hand the token to a queue or another thread's
loop); one that raises fails its sequence with that exception. One
thread owns the model: each iteration it runs queued control commands,
admits queued requests (unless paused), prefills them within a token budget
(long prompts in chunks, so running rows keep decoding), samples their first
token, joins them to the running ``DecodeBatch``, and runs one decode step for
every running row. Finished rows leave at once. With a ``PrefixCache``, a
finished sequence's KV is kept and a later prompt that starts with its ids
prefills only the rest; ``reset_prefix_cache`` (on the compute thread, as every
weight update does) drops it, and a sequence admitted before a reset is not
stored after it (its KV mixes two weight versions). ``pause`` freezes everything
in flight between two iterations (vLLM ``mode=keep``: caches kept) or first
drains it (``mode=wait``); ``call`` runs a function (a weight update) on the
compute thread between iterations. Every blocking wait takes a timeout.

Why not transformers' continuous batching (``generate_batch``,
``return_logprobs``)? It runs on CPU and its logprobs are post-temperature,
but it has no per-request seed, top-k/top-p per request or stop strings, it
sizes its paged cache from free RAM unless tuned, it was slower than one
padded batch for requests arriving together (REFERENCE §8), and its manager
offers no pause that keeps in-flight requests for a weight swap. This loop is
~200 lines over a plain ``DynamicCache``, keeps the exact position ids a
teacher-forced pass uses, and owns the pause/update semantics the trainer
needs.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from harness_grpo.engine.errors import EngineError
from harness_grpo.engine.kv_batch import DecodeBatch
from harness_grpo.engine.prefix_cache import Layers, PrefixCache
from harness_grpo.engine.sampling import SamplingParams, choose, processed_logprobs

logger = logging.getLogger(__name__)

PAUSE_MODES = ("keep", "wait")

# ``on_token(token_id, logprob, top_logprobs)``, called on the compute thread (see the module docstring).
TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]


@dataclass(slots=True)
class Completion:
    """What one request sampled.

    ``token_ids`` include a final EOS id when generation stopped on one;
    ``text`` is their decoding without special tokens, cut before a matched
    stop string. ``logprobs[i]`` is the processed logprob of ``token_ids[i]``;
    ``top_logprobs[i]`` the request's ``top_logprobs`` best ``(id, logprob)``
    pairs of that position, best first (empty lists when 0 were asked).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str  # "stop" | "length"
    stop_reason: str | None  # the matched stop string, None for EOS or length


@dataclass(slots=True)
class GeneratorStats:
    """Counters kept by the compute thread (read them, don't write them)."""

    peak_batch_size: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0


@dataclass(slots=True, eq=False)
class _Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    rng: torch.Generator
    on_token: TokenCallback | None = None
    future: Future = field(default_factory=Future)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    cache: DynamicCache | None = None
    prefilled: int = 0
    done: bool = False
    completion: Completion | None = None  # set by ``_finish``, delivered by ``_deliver`` once its KV is stored
    cache_epoch: int = 0  # the prefix cache's epoch when admitted


class Generator:
    """The compute thread and its queues; see the module docstring for the contract."""

    def __init__(
        self,
        model: torch.nn.Module,
        decode: Callable[[list[int]], str],
        eos_token_ids: set[int],
        *,
        max_num_seqs: int = 64,
        prefill_chunk_tokens: int = 2048,
        num_threads: int = 1,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.decode = decode
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.num_threads = num_threads
        self.stats = GeneratorStats()
        self.prefix_cache = prefix_cache
        self._cache_epoch = 0  # owned by the compute thread
        self._cond = threading.Condition()
        self._incoming: deque[_Sequence] = deque()
        self._commands: deque[tuple[Callable[[], Any], Future]] = deque()
        self._admitting = True
        self._paused = False
        self._stopping = False
        self._idle = True
        # Owned by the compute thread.
        self._prefilling: deque[_Sequence] = deque()
        self._batch: DecodeBatch[_Sequence] = DecodeBatch()
        self._thread = threading.Thread(target=self._run, name="engine-compute", daemon=True)

    # ----- any thread -------------------------------------------------------

    def start(self) -> None:
        """Start the compute thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the compute thread; queued and in-flight requests fail with a 503."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise EngineError(504, f"compute thread did not stop within {timeout_s}s")

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet admitted to a batch (vLLM's ``num_requests_waiting``)."""
        return len(self._incoming)

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> Future:
        """Queue one request; the future resolves to a ``Completion``, ``on_token`` sees each token first."""
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        seq = _Sequence(list(prompt_ids), params, torch.Generator().manual_seed(seed), on_token)
        with self._cond:
            self._check_running()
            self._incoming.append(seq)
            self._cond.notify_all()
        return seq.future

    def call[R](self, fn: Callable[[], R], timeout_s: float) -> R:
        """Run ``fn`` on the compute thread between two iterations and return its result."""
        future: Future = Future()
        with self._cond:
            self._check_running()
            self._commands.append((fn, future))
            self._cond.notify_all()
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            if future.cancel():
                raise EngineError(504, f"the compute thread did not reach the command within {timeout_s}s") from None
            return future.result(timeout=timeout_s)

    def pause(self, mode: str = "keep", timeout_s: float = 60.0) -> None:
        """Stop admitting requests and freeze in-flight ones (``keep``), or drain them first (``wait``).

        Returns once no forward pass is running; the caller may then swap weights.
        """
        if mode not in PAUSE_MODES:
            raise EngineError(400, f"unsupported pause mode {mode!r}; use one of {list(PAUSE_MODES)}", "mode")
        with self._cond:
            self._admitting = False
            if mode == "wait" and not self._cond.wait_for(lambda: self._idle or self._stopping, timeout_s):
                self._admitting = not self._paused
                raise EngineError(504, f"in-flight requests did not finish within {timeout_s}s")
            self._paused = True
        self.call(lambda: None, timeout_s)

    def resume(self) -> None:
        """Admit and run requests again."""
        with self._cond:
            self._paused = False
            self._admitting = True
            self._cond.notify_all()

    def _check_running(self) -> None:
        if self._stopping or not self._thread.is_alive():
            raise EngineError(503, "the engine is not running")

    # ----- compute thread ---------------------------------------------------

    def _has_work(self) -> bool:
        if self._stopping or self._commands:
            return True
        if self._paused:
            return False
        in_flight = len(self._prefilling) + len(self._batch)
        return in_flight > 0 or (self._admitting and bool(self._incoming) and in_flight < self.max_num_seqs)

    def _run(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # this thread's intra-op pool only; 0 keeps torch's
        with torch.inference_mode():
            while True:
                with self._cond:
                    self._idle = not (self._prefilling or self._batch)
                    self._cond.notify_all()
                    self._cond.wait_for(self._has_work)
                    if self._stopping:
                        break
                    commands, self._commands = self._commands, deque()
                    while self._admitting and self._incoming and self._in_flight() < self.max_num_seqs:
                        seq = self._incoming.popleft()
                        if not seq.future.cancelled():
                            seq.cache_epoch = self._cache_epoch
                            self._prefilling.append(seq)
                    self._idle = not (self._prefilling or self._batch)
                    running = not self._paused
                for fn, future in commands:
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(fn())
                        except Exception as exc:
                            future.set_exception(exc)
                if running:
                    self._iterate()
        with self._cond:
            orphans = [*self._incoming, *self._prefilling, *self._batch.items]
            self._incoming.clear()
            commands, self._commands = self._commands, deque()
        for seq in orphans:
            self._fail(seq, EngineError(503, "the engine stopped"))
        for _, future in commands:
            future.cancel()

    def reset_prefix_cache(self) -> None:
        """Drop the prefix cache (compute thread only: run it through ``call``, as weight updates do)."""
        self._cache_epoch += 1
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _in_flight(self) -> int:
        return len(self._prefilling) + len(self._batch)

    def _iterate(self) -> None:
        self._drop_cancelled()
        ready = self._prefill()
        try:
            self._batch.join(ready)
            if self._batch:
                self._decode()
        except Exception as exc:
            logger.exception("decode step failed; failing the running batch")
            for seq in {*self._batch.items, *(seq for seq, _, _ in ready)}:
                self._fail(seq, exc)
            self._batch.retain([])

    def _drop_cancelled(self) -> None:
        self._prefilling = deque(seq for seq in self._prefilling if not seq.future.cancelled())
        self._batch.retain([i for i, seq in enumerate(self._batch.items) if not seq.future.cancelled()])

    def _prefill(self) -> list[tuple[_Sequence, DynamicCache, int]]:
        """Prefill queued prompts within the token budget; return those ready to decode."""
        budget = self.prefill_chunk_tokens
        ready = []
        while self._prefilling and budget > 0:
            seq = self._prefilling[0]
            if seq.cache is None and self.prefix_cache is not None:
                self._reuse_prefix(seq)
            n = min(budget, len(seq.prompt_ids) - seq.prefilled)
            budget -= n
            try:
                token = self._prefill_chunk(seq, n)
            except Exception as exc:
                logger.exception("prefill failed")
                self._prefilling.popleft()
                self._fail(seq, exc)
                continue
            if token is None:
                break
            self._prefilling.popleft()
            if not seq.done:
                ready.append((seq, seq.cache, token))
            elif seq.completion is not None:  # stopped at its first token: its KV is the prompt's
                self._store(seq, [(layer.keys, layer.values) for layer in seq.cache.layers])
                self._deliver(seq)
            seq.cache = None
        return ready

    def _reuse_prefix(self, seq: _Sequence) -> None:
        """Start ``seq``'s cache from the longest cached prefix of its prompt, if any."""
        hit = self.prefix_cache.lookup(seq.prompt_ids)
        if hit is None:
            return
        length, layers = hit
        seq.cache = DynamicCache(config=self.model.config)
        for layer, (keys, values) in zip(seq.cache.layers, layers, strict=True):
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        seq.prefilled = length

    def _store(self, seq: _Sequence, layers: Layers) -> None:
        """Keep a completed sequence's KV (that of its prompt and every sampled id but the last, never fed)."""
        if self.prefix_cache is not None and seq.cache_epoch == self._cache_epoch:
            self.prefix_cache.store(seq.prompt_ids + seq.token_ids[:-1], layers)

    def _prefill_chunk(self, seq: _Sequence, n: int) -> int | None:
        """Run the next ``n`` prompt tokens; at the prompt's end, sample and return the first token."""
        start = seq.prefilled
        if seq.cache is None:
            seq.cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=torch.tensor([seq.prompt_ids[start : start + n]]),
            position_ids=torch.arange(start, start + n)[None],
            cache=seq.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        seq.prefilled += n
        self.stats.prefill_tokens += n
        if seq.prefilled < len(seq.prompt_ids):
            return None
        (token,) = self._sample([seq], out.logits[:, -1])
        return token

    def _decode(self) -> None:
        self.stats.peak_batch_size = max(self.stats.peak_batch_size, len(self._batch))
        self.stats.decode_steps += 1
        logits = self._batch.step(self.model)
        tokens = self._sample(self._batch.items, logits)
        self._batch.set_next_tokens(tokens)
        for i, seq in enumerate(self._batch.items):
            if seq.completion is not None:
                if self.prefix_cache is not None:
                    self._store(seq, self._batch.row_cache(i))
                self._deliver(seq)
        self._batch.retain([i for i, seq in enumerate(self._batch.items) if not seq.done])

    def _sample(self, seqs: list[_Sequence], logits: torch.Tensor) -> list[int]:
        """Sample one token per row, record it, and finish the rows that stop."""
        logprobs = processed_logprobs(logits, [seq.params for seq in seqs])
        tokens = [choose(logprobs[i], seq.params, seq.rng) for i, seq in enumerate(seqs)]
        chosen = logprobs.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()
        k = max(seq.params.top_logprobs for seq in seqs)
        top_ids: list[list[int]] = []
        top_values: list[list[float]] = []
        if k:
            top_values, top_ids = logprobs.topk(k, dim=-1)
            top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for i, seq in enumerate(seqs):
            seq.token_ids.append(tokens[i])
            seq.logprobs.append(chosen[i])
            n = seq.params.top_logprobs
            seq.top_logprobs.append(list(zip(top_ids[i][:n], top_values[i][:n], strict=True)) if n else [])
            if seq.on_token is not None:
                try:
                    seq.on_token(tokens[i], chosen[i], seq.top_logprobs[-1])
                except Exception as exc:
                    logger.exception("a token callback failed; failing its sequence")
                    self._fail(seq, exc)
                    continue
            self._check_finished(seq)
        self.stats.generated_tokens += len(seqs)
        return tokens

    def _check_finished(self, seq: _Sequence) -> None:
        if seq.token_ids[-1] in self.eos_token_ids and not seq.params.ignore_eos:
            self._finish(seq, "stop", None, self.decode(seq.token_ids))
            return
        if seq.params.stop:
            text = self.decode(seq.token_ids)
            hits = [(i, s) for s in seq.params.stop if (i := text.find(s)) >= 0]
            if hits:
                index, stop = min(hits)
                self._finish(seq, "stop", stop, text[:index])
                return
        if len(seq.token_ids) >= seq.params.max_tokens:
            self._finish(seq, "length", None, self.decode(seq.token_ids))

    def _finish(self, seq: _Sequence, reason: str, stop_reason: str | None, text: str) -> None:
        seq.done = True
        seq.completion = Completion(
            seq.prompt_ids, seq.token_ids, seq.logprobs, seq.top_logprobs, text, reason, stop_reason
        )

    def _deliver(self, seq: _Sequence) -> None:
        """Resolve a finished sequence's future (after its KV is stored, so a caller's next request finds it)."""
        with contextlib.suppress(InvalidStateError):  # the waiter cancelled meanwhile
            seq.future.set_result(seq.completion)

    def _fail(self, seq: _Sequence, exc: BaseException) -> None:
        seq.done = True
        seq.cache = None
        with contextlib.suppress(InvalidStateError):
            seq.future.set_exception(exc)
