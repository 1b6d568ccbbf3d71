"""The exact bytes of a token id, for logprob entries.

Contract: ``TokenBytes(tokenizer)(token_id)`` is the UTF-8 byte string the
token contributes to decoded text, so the bytes of consecutive entries
concatenate to the text even when a character spans several tokens (OpenAI's
meaning of ``bytes``). Byte-level BPE tokens are mapped back through GPT-2's
byte alphabet; added tokens and other tokenizers fall back to the token's own
decoding (a partial character then reads as U+FFFD). Results are cached.
"""

from __future__ import annotations

import functools

from tokenizers import decoders
from transformers import PreTrainedTokenizerBase


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed (character -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


BYTE_ALPHABET = _byte_alphabet()


class TokenBytes:
    """Callable ``token_id -> bytes`` for one tokenizer (thread-safe, cached)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = backend is not None and isinstance(backend.decoder, decoders.ByteLevel)
        self.added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self._cached = functools.lru_cache(maxsize=1 << 16)(self._bytes)

    def __call__(self, token_id: int) -> bytes:
        return self._cached(token_id)

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        if self.byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and all(c in BYTE_ALPHABET for c in piece):
                return bytes(BYTE_ALPHABET[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode()
