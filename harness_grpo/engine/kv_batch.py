"""The running decode batch: one left-padded KV cache shared by all sequences.

Contract: each sequence is prefilled alone (no padding, positions
``0..P-1``), then ``join`` left-pads its cache and the batch's to a common
length and stacks them. A decode ``step`` feeds every row its last sampled
token with attention mask = real tokens only and position id = the number of
real tokens before it, so each row computes what a single-sequence pass over
the same ids computes (up to float reordering, ~1e-6 in logprobs).
``retain`` drops finished rows and trims columns that are padding for every
remaining row. Only full-attention decoder caches (``DynamicLayer``) are
supported; the engine checks this when it loads a model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _pad_left(x: torch.Tensor, n: int, dim_from_end: int) -> torch.Tensor:
    if n == 0:
        return x
    pad = [0, 0] * (dim_from_end - 1) + [n, 0]
    return F.pad(x, pad)


class DecodeBatch[T]:
    """Rows of ``items`` decoding together; row ``i`` of every tensor belongs to ``items[i]``."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.items: list[T] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)  # [B, L] 1 = real token
        self._positions = torch.zeros(0, dtype=torch.long)  # [B] position id of the next fed token
        self._tokens = torch.zeros(0, dtype=torch.long)  # [B] next token to feed

    def __len__(self) -> int:
        return len(self.items)

    @property
    def kv_length(self) -> int:
        """Columns of the shared cache (the longest row, after trimming)."""
        return self._mask.shape[1]

    def join(self, entries: list[tuple[T, DynamicCache, int]]) -> None:
        """Add sequences, each as ``(item, prefilled cache of batch 1, first sampled token)``."""
        if not entries:
            return
        lengths = [cache.get_seq_length() for _, cache, _ in entries]
        width = max(self.kv_length, *lengths)
        caches = ([self._cache] if self._cache is not None else []) + [cache for _, cache, _ in entries]
        pads = ([width - self.kv_length] if self._cache is not None else []) + [width - n for n in lengths]
        merged = caches[0]
        for layer_idx, layer in enumerate(merged.layers):
            layers = [cache.layers[layer_idx] for cache in caches]
            layer.keys = torch.cat([_pad_left(lay.keys, p, 2) for lay, p in zip(layers, pads, strict=True)])
            layer.values = torch.cat([_pad_left(lay.values, p, 2) for lay, p in zip(layers, pads, strict=True)])
        new_mask = torch.stack([_pad_left(torch.ones(n, dtype=torch.long), width - n, 1) for n in lengths])
        self._mask = torch.cat([_pad_left(self._mask, width - self.kv_length, 1), new_mask])
        self._positions = torch.cat([self._positions, torch.tensor(lengths, dtype=torch.long)])
        self._tokens = torch.cat([self._tokens, torch.tensor([tok for _, _, tok in entries], dtype=torch.long)])
        self._cache = merged
        self.items.extend(item for item, _, _ in entries)

    def step(self, model: torch.nn.Module) -> torch.Tensor:
        """One decode forward over every row; returns the next-token logits ``[B, V]``."""
        mask = torch.cat([self._mask, torch.ones(len(self), 1, dtype=torch.long)], dim=1)
        out = model(
            input_ids=self._tokens[:, None],
            attention_mask=mask,
            position_ids=self._positions[:, None],
            cache=self._cache,
            use_cache=True,
        )
        self._mask = mask
        self._positions = self._positions + 1
        return out.logits[:, -1]

    def row_cache(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s real KV columns as a batch-1 copy per layer: ``(keys, values)``, ``[1, heads, n, dim]``."""
        n = int(self._mask[row].sum())
        return [
            (layer.keys[row : row + 1, :, -n:].clone(), layer.values[row : row + 1, :, -n:].clone())
            for layer in self._cache.layers
        ]

    def set_next_tokens(self, tokens: list[int]) -> None:
        """The tokens each row feeds at the next ``step``."""
        self._tokens = torch.tensor(tokens, dtype=torch.long)

    def retain(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order) and trim all-padding leading columns."""
        if len(rows) == len(self):
            return
        if not rows:
            self._clear()
            return
        index = torch.tensor(rows, dtype=torch.long)
        mask = self._mask[index]
        start = int(torch.nonzero(mask.any(dim=0))[0])
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        self._mask = mask[:, start:]
        self._positions = self._positions[index]
        self._tokens = self._tokens[index]
        self.items = [self.items[i] for i in rows]
