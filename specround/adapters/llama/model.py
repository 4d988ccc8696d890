"""A compact Llama decoder in torch: one readable forward over flat token rows.

The forward takes *flat* rows (``Q`` tokens of possibly several requests, each with its absolute position)
and an :class:`AttentionRows` object that owns where keys and values live: it stores each layer's new K/V
rows and returns the key/value rows every query may read, with the boolean visibility mask
``[Q, Kv]``. Grouped-query attention runs through ``scaled_dot_product_attention`` with that explicit mask,
never a bare ``is_causal`` (contract#visibility). Passing ``num_layers`` runs only the first layers, then the
final norm and the head (early exit for self-speculation).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from specround.adapters.llama.config import LlamaConfig
from specround.adapters.llama.weights import LayerWeights, LlamaWeights
from specround.errors import InvalidRequestError

__all__ = ["AttentionRows", "FreshCausal", "LlamaModel", "RotaryEmbedding", "rms_norm"]


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis.  [..., H] -> [..., H]."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return gain * (x * torch.rsqrt(variance + eps))


class RotaryEmbedding:
    """Rotary position tables in the "rotate half" layout (pairs ``(i, i + D/2)``)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        self.inv_freq = 1.0 / (theta**exponents)  # [D/2]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for absolute positions [Q] -> cos, sin [Q, 1, D] (broadcast over heads)."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [Q, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [Q, D]
        return angles.cos()[:, None, :], angles.sin()[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [Q, heads, D] by the tables [Q, 1, D]."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class AttentionRows(Protocol):
    """Where one forward's keys and values live, and which of them each query row may read."""

    @property
    def mask(self) -> torch.Tensor:
        """[Q, Kv] bool: query row u may read key row v (the same for every layer)."""
        ...

    def keys_values(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store layer's new rows k, v [Q, kv_heads, D]; return every readable K, V [Kv, kv_heads, D]."""
        ...


class FreshCausal:
    """One sequence with no cache: keys are the new rows themselves, causally masked."""

    def __init__(self, length: int, device: torch.device | None = None) -> None:
        self._mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # [Q, Q]

    @property
    def mask(self) -> torch.Tensor:
        """[Q, Q] lower-triangular."""
        return self._mask

    def keys_values(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new rows are all the keys."""
        del layer
        return k, v


class LlamaModel:
    """Llama decoder with fp32 weights; stateless apart from its weights (K/V live in the caller's store)."""

    def __init__(self, config: LlamaConfig, weights: LlamaWeights) -> None:
        weights.validate(config)
        self.config = config
        self.weights = weights
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionRows,
        *,
        num_layers: int | None = None,
        head_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [Q, V] float32 for flat rows token_ids [Q] at absolute positions [Q].

        ``num_layers`` (1..L) runs only the first layers before the final norm and head. ``head_rows``
        [R] int64 selects the rows that get logits (the result is then [R, V]); None means every row.
        """
        depth = self.config.num_layers if num_layers is None else num_layers
        if not 1 <= depth <= self.config.num_layers:
            raise InvalidRequestError(f"num_layers must lie in 1..{self.config.num_layers}, got {depth}")
        x = F.embedding(token_ids, self.weights.embed)  # [Q, H]
        cos, sin = self.rotary.cos_sin(positions)  # [Q, 1, D] each
        mask = attention.mask[None, None]  # [1, 1, Q, Kv]
        eps = self.config.rms_eps
        for index in range(depth):
            layer = self.weights.layers[index]
            x = x + self._attention(
                index, layer, rms_norm(x, layer.attn_norm, eps), cos, sin, attention, mask
            )
            h = rms_norm(x, layer.ffn_norm, eps)
            x = x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up), layer.w_down)
        if head_rows is not None:
            x = x.index_select(0, head_rows)  # [R, H]
        return F.linear(rms_norm(x, self.weights.norm, eps), self.weights.lm_head)  # [Q or R, V]

    def _attention(
        self,
        index: int,
        layer: LayerWeights,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionRows,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.config
        rows = h.shape[0]
        q = F.linear(h, layer.wq).view(rows, cfg.num_heads, cfg.head_dim)  # [Q, heads, D]
        k = F.linear(h, layer.wk).view(rows, cfg.num_kv_heads, cfg.head_dim)  # [Q, kv_heads, D]
        v = F.linear(h, layer.wv).view(rows, cfg.num_kv_heads, cfg.head_dim)  # [Q, kv_heads, D]
        q = RotaryEmbedding.apply(q, cos, sin)
        k = RotaryEmbedding.apply(k, cos, sin)
        keys, values = attention.keys_values(index, k, v)  # [Kv, kv_heads, D] each
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # [1, heads, Q, D]
            keys.transpose(0, 1)[None],  # [1, kv_heads, Kv, D]
            values.transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=cfg.group_size > 1,
        )  # [1, heads, Q, D]
        return F.linear(out[0].transpose(0, 1).reshape(rows, cfg.num_heads * cfg.head_dim), layer.wo)

    def logits(self, token_ids: torch.Tensor, *, num_layers: int | None = None) -> torch.Tensor:
        """Logits [T, V] of one whole sequence token_ids [T] at positions 0..T-1, with no cache."""
        positions = torch.arange(token_ids.shape[0])
        return self.forward(token_ids, positions, FreshCausal(token_ids.shape[0]), num_layers=num_layers)
