"""The embedded engine: a transformers model, its tokenizer and the compute thread.

Contract: ``EmbeddedEngine(model)`` loads ``model`` (a local path, a hub id,
or ``"tiny"`` for the built tiny model) with ``load_causal_lm`` (no Hub kernels) and
``AutoTokenizer`` and starts nothing; ``start()`` starts the compute thread,
``stop()`` ends it. It is thread-safe: prompts are rendered and encoded on the
calling thread, generation runs on the compute thread (``submit`` returns a
``concurrent.futures.Future``, and its ``on_token`` callback sees each token as
it is sampled; ``generate`` waits for the future). ``pause``/``resume``
and ``update_weights`` give the trainer vLLM's weight-sync protocol
in-process: an update is checked, then copied between two decode iterations,
and ``weight_version`` grows by one (or to the explicit version given, which
must be larger). With ``pause(mode="keep")`` in-flight requests resume under
the new weights, as in vLLM.

``enable_prefix_caching`` (vLLM's flag; off by default) keeps the KV of
finished sequences, up to ``prefix_cache_bytes``, so a multi-turn agent's next
call prefills only what it added (``engine.prefix_cache``; see
``prefix_cache``). Every weight update drops it. Logprobs then match a cold
prefill to float rounding (~1e-6), not bit for bit.

The compute thread runs torch with ``num_threads`` intra-op threads (0:
torch's default, one per core). The default is 1: the engine shares its CPUs
with the trainer, the proxy and the agents, and with more busy threads than
cores torch's spinning thread pool collapses (on a loaded 2-core box, 2
threads decoded the tiny model 6x slower than 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from harness_grpo.engine.errors import EngineError, bad_request
from harness_grpo.engine.generator import Completion, Generator, GeneratorStats, TokenCallback
from harness_grpo.engine.prefix_cache import PrefixCache
from harness_grpo.engine.sampling import SamplingParams
from harness_grpo.engine.tokens import TokenBytes
from harness_grpo.engine.weights import check_state_dict, copy_state_dict
from harness_grpo.model_loading import load_causal_lm
from harness_grpo.tiny_model import SERVED_MODEL_NAME, tiny_model_path
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

logger = logging.getLogger(__name__)

TINY = "tiny"
TINY_WARM = "tiny-warm"


def resolve_model(model: str | Path) -> tuple[str, str]:
    """``(path or hub id, default served name)``; ``"tiny"``/``"tiny-warm"`` build the tiny model (warm-started)."""
    if str(model) == TINY:
        return str(tiny_model_path()), SERVED_MODEL_NAME
    if str(model) == TINY_WARM:
        return str(warm_tiny_model_path()), SERVED_MODEL_NAME
    return str(model), str(model)


class EmbeddedEngine:
    """A CPU inference engine serving one model; see the module docstring."""

    def __init__(
        self,
        model: str | Path = TINY,
        *,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        prefill_chunk_tokens: int = 2048,
        num_threads: int = 1,
        dtype: torch.dtype | None = None,
        enable_prefix_caching: bool = False,
        prefix_cache_bytes: int = 512 << 20,
    ) -> None:
        path, default_name = resolve_model(model)
        self.model_path = path
        self.served_model_name = served_model_name or default_name
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = load_causal_lm(path, dtype).eval()
        self.model.requires_grad_(False)
        config = self.model.config.get_text_config(decoder=True)
        layer_types = {type(layer) for layer in DynamicCache(config=self.model.config).layers}
        if layer_types != {DynamicLayer}:
            raise ValueError(f"the embedded engine needs full-attention layers only, got {layer_types}")
        limit = config.max_position_embeddings
        if max_model_len is not None and not 0 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}], got {max_model_len}")
        self.max_model_len = max_model_len or limit
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.eos_token_ids = self._eos_ids()
        self.token_bytes = TokenBytes(self.tokenizer)
        self.weight_version = 0
        self.created = int(time.time())
        self._generator = Generator(
            self.model,
            self.decode,
            self.eos_token_ids,
            max_num_seqs=max_num_seqs,
            prefill_chunk_tokens=prefill_chunk_tokens,
            num_threads=num_threads,
            prefix_cache=PrefixCache(prefix_cache_bytes) if enable_prefix_caching else None,
        )

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ----- lifecycle --------------------------------------------------------

    def start(self) -> EmbeddedEngine:
        """Start the compute thread; returns ``self``."""
        self._generator.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the compute thread; outstanding requests fail with a 503 ``EngineError``."""
        self._generator.stop(timeout_s)

    @property
    def paused(self) -> bool:
        return self._generator.paused

    @property
    def num_waiting(self) -> int:
        return self._generator.num_waiting

    @property
    def stats(self) -> GeneratorStats:
        return self._generator.stats

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The prefix cache (None without ``enable_prefix_caching``); its ``stats`` count hits and reused ids."""
        return self._generator.prefix_cache

    # ----- tokens -----------------------------------------------------------

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Prompt ids of a chat: the chat template, then encoded (400 on template errors).

        The defaults are what ``/v1/chat/completions`` renders; ``/tokenize`` passes its own flags.
        """
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **(chat_template_kwargs or {}),
            )
        except Exception as exc:  # jinja errors, bad kwargs: the request's fault
            raise bad_request(f"the chat template could not render the request: {exc}", "messages") from None
        return self.encode(text, add_special_tokens=add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; by default no added special tokens (a rendered template already has them)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens kept (vLLM's ``/detokenize``)."""
        return self.tokenizer.decode(token_ids)

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """The tokenizer's own string for each id (byte-level pieces such as ``"Ġx"``)."""
        return self.tokenizer.convert_ids_to_tokens(list(token_ids))

    # ----- generation -------------------------------------------------------

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> Future:
        """Queue a request; the future resolves to a ``Completion``; ``on_token`` streams (``generator``)."""
        if not prompt_ids or not all(0 <= t < self.vocab_size for t in prompt_ids):
            raise bad_request(f"prompt ids must be a non-empty list in [0, {self.vocab_size})", "prompt")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise bad_request(f"prompt + max_tokens exceeds max_model_len {self.max_model_len}", "max_tokens")
        return self._generator.submit(prompt_ids, params, on_token)

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, timeout_s: float = 600.0) -> Completion:
        """Submit and wait (504 ``EngineError`` after ``timeout_s``)."""
        future = self.submit(prompt_ids, params)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise EngineError(504, f"generation did not finish within {timeout_s}s") from None

    # ----- weight sync ------------------------------------------------------

    def pause(self, mode: str = "keep", timeout_s: float = 60.0) -> None:
        """Stop admitting work; ``keep`` freezes in-flight requests, ``wait`` drains them first."""
        self._generator.pause(mode, timeout_s)

    def resume(self) -> None:
        """Admit and run requests again."""
        self._generator.resume()

    def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        version: int | None = None,
        timeout_s: float = 300.0,
        *,
        rebase: bool = False,
    ) -> int:
        """Copy ``state_dict`` (any subset of the model's names) into the served model; returns the new version.

        ``version`` must be above the current one, unless ``rebase``: a new run's first push, whose
        numbering starts again whatever an earlier run left the engine at."""
        check_state_dict(self.model, state_dict)

        def apply() -> int:
            new_version = self.weight_version + 1 if version is None else version
            if new_version <= self.weight_version and not rebase:
                raise bad_request(f"version {new_version} is not above the current {self.weight_version}", "version")
            copy_state_dict(self.model, state_dict)
            self._generator.reset_prefix_cache()
            self.weight_version = new_version
            return new_version

        new_version = self._generator.call(apply, timeout_s)
        logger.info("weights updated to version %d (%d tensors)", new_version, len(state_dict))
        return new_version

    def health(self) -> dict[str, Any]:
        """Liveness plus the current weight version and pause state."""
        return {"status": "ok", "weight_version": self.weight_version, "paused": self.paused}
