"""Hyper-parameters of a Llama-family decoder, read from GGUF metadata or declared for a tiny test model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specround.errors import ModelLoadError

__all__ = ["LlamaConfig"]


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """Shape and numerics of a Llama decoder (grouped-query attention, SwiGLU, RMSNorm, rotary positions)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    context_length: int
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "context_length": self.context_length,
        }
        bad = [name for name, value in positive.items() if value < 1]
        if bad:
            raise ModelLoadError(f"model configuration fields must be positive: {', '.join(bad)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_eps > 0:
            raise ModelLoadError("rope_theta and rms_eps must be positive")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (for cache keys and model ids)."""
        return asdict(self)

    @classmethod
    def tiny(
        cls,
        *,
        vocab_size: int = 8,
        hidden_size: int = 16,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        context_length: int = 256,
    ) -> LlamaConfig:
        """A tiny configuration for random-weight models in statistical tests (no GGUF needed)."""
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=hidden_size // num_heads,
            rope_theta=10_000.0,
            rms_eps=1e-5,
            context_length=context_length,
        )
