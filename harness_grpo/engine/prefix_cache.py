"""Automatic prefix caching: the KV of finished sequences, reused by later prompts that start with their ids.

Contract: ``store(ids, layers)`` keeps the per-layer ``(keys, values)`` (each ``[1, heads, len(ids), dim]``)
computed for ``ids``; ``lookup(prompt_ids)`` answers the longest cached prefix of ``prompt_ids`` (at most
``len(prompt_ids) - 1`` ids, so the prompt's last id is always run and gives the first token's logits) as
``(length, layers)``, the tensors sliced to that length and never written to by the caller, or ``None``
below ``min_tokens``. An entry whose ids begin another entry's is dropped for it (the longer answers every
lookup the shorter would, at least as long). Entries are evicted least recently used beyond ``max_bytes``;
``clear()`` drops all (the engine does on every weight update: a KV is only valid for the weights that
computed it). Only the compute thread calls these.

A multi-turn agent resends its history each call, so without this every call prefills the whole
conversation; with it a call prefills only what was added since its last one (vLLM's automatic prefix
caching, per whole sequence instead of per block).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters (read them, don't write them)."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0


@dataclass(slots=True, eq=False)
class _Entry:
    ids: torch.Tensor  # [n] int64
    layers: Layers
    nbytes: int


class PrefixCache:
    """Finished sequences' KV, by their token ids; see the module docstring."""

    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # key: id(entry), oldest first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, prompt_ids: list[int]) -> tuple[int, Layers] | None:
        """The longest usable cached prefix of ``prompt_ids``: ``(length, layers sliced to it)``, or None."""
        self.stats.lookups += 1
        limit = len(prompt_ids) - 1
        if limit < self.min_tokens or not self._entries:
            return None
        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        best, best_length = None, 0
        for entry in self._entries.values():
            n = min(limit, len(entry.ids))
            if n <= best_length:
                continue
            differs = torch.nonzero(entry.ids[:n] != prompt[:n])
            length = int(differs[0]) if len(differs) else n
            if length > best_length:
                best, best_length = entry, length
        if best is None or best_length < self.min_tokens:
            return None
        self._entries.move_to_end(id(best))
        self.stats.hits += 1
        self.stats.reused_tokens += best_length
        return best_length, [(k[:, :, :best_length], v[:, :, :best_length]) for k, v in best.layers]

    def store(self, ids: list[int], layers: Layers) -> None:
        """Keep ``layers`` (the KV of ``ids``, one ``(keys, values)`` per layer) unless too short or too large."""
        if len(ids) < self.min_tokens:
            return
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if nbytes > self.max_bytes:
            return
        new = torch.tensor(ids, dtype=torch.long)
        for key, entry in list(self._entries.items()):
            n = len(entry.ids)
            if n <= len(new) and torch.equal(entry.ids, new[:n]):
                self._drop(key)
            elif n > len(new) and torch.equal(entry.ids[: len(new)], new):
                self._entries.move_to_end(key)  # already cached, as part of a longer sequence
                return
        entry = _Entry(new, layers, nbytes)
        self._entries[id(entry)] = entry
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats.evictions += 1

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes
