"""A Llama decoder's tensors as plain fp32 tensors; seeded random weights; reduced-precision copies.

Linear weights are stored ``[out_features, in_features]`` (``y = x @ w.T``). Query and key projections are in
the Hugging Face row order (rotary pairs are ``(i, i + head_dim / 2)``); the GGUF loader undoes llama.cpp's
interleaving permutation before building these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from specround.adapters.llama.config import LlamaConfig
from specround.errors import ModelLoadError

__all__ = ["LayerWeights", "LlamaWeights", "random_weights"]


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder block."""

    attn_norm: torch.Tensor
    """[H] RMSNorm gain before attention."""
    wq: torch.Tensor
    """[heads * D, H]."""
    wk: torch.Tensor
    """[kv_heads * D, H]."""
    wv: torch.Tensor
    """[kv_heads * D, H]."""
    wo: torch.Tensor
    """[H, heads * D]."""
    ffn_norm: torch.Tensor
    """[H] RMSNorm gain before the MLP."""
    w_gate: torch.Tensor
    """[F, H]."""
    w_up: torch.Tensor
    """[F, H]."""
    w_down: torch.Tensor
    """[H, F]."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Field name -> tensor."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class LlamaWeights:
    """Every tensor of the decoder; ``lm_head`` is the embedding itself when embeddings are tied."""

    embed: torch.Tensor
    """[V, H] token embeddings."""
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    """[H] final RMSNorm gain."""
    lm_head: torch.Tensor
    """[V, H] output projection."""

    def validate(self, config: LlamaConfig) -> None:
        """Raise :class:`ModelLoadError` unless every shape matches ``config``."""
        h, d = config.hidden_size, config.head_dim
        expected_layer = {
            "attn_norm": (h,),
            "wq": (config.num_heads * d, h),
            "wk": (config.num_kv_heads * d, h),
            "wv": (config.num_kv_heads * d, h),
            "wo": (h, config.num_heads * d),
            "ffn_norm": (h,),
            "w_gate": (config.intermediate_size, h),
            "w_up": (config.intermediate_size, h),
            "w_down": (h, config.intermediate_size),
        }
        problems: list[str] = []
        for name, tensor, shape in (
            ("embed", self.embed, (config.vocab_size, h)),
            ("norm", self.norm, (h,)),
            ("lm_head", self.lm_head, (config.vocab_size, h)),
        ):
            if tuple(tensor.shape) != shape:
                problems.append(f"{name}: {tuple(tensor.shape)} != {shape}")
        if len(self.layers) != config.num_layers:
            problems.append(f"{len(self.layers)} layers != {config.num_layers}")
        for index, layer in enumerate(self.layers):
            for name, tensor in layer.tensors().items():
                if tuple(tensor.shape) != expected_layer[name]:
                    problems.append(f"layers.{index}.{name}: {tuple(tensor.shape)} != {expected_layer[name]}")
        if problems:
            raise ModelLoadError("weights do not match the configuration: " + "; ".join(problems[:5]))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor mapping (the tied head is stored once, as ``embed``)."""
        out = {"embed": self.embed, "norm": self.norm}
        if self.lm_head is not self.embed:
            out["lm_head"] = self.lm_head
        for index, layer in enumerate(self.layers):
            for name, tensor in layer.tensors().items():
                out[f"layers.{index}.{name}"] = tensor
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], num_layers: int) -> LlamaWeights:
        """Inverse of :meth:`state_dict`."""
        try:
            layers = tuple(
                LayerWeights(**{f.name: state[f"layers.{i}.{f.name}"] for f in fields(LayerWeights)})
                for i in range(num_layers)
            )
            embed = state["embed"]
            return cls(embed=embed, layers=layers, norm=state["norm"], lm_head=state.get("lm_head", embed))
        except KeyError as exc:
            raise ModelLoadError(f"weights are missing tensor {exc.args[0]!r}") from exc

    def rounded_through(self, dtype: torch.dtype) -> LlamaWeights:
        """A copy whose every tensor was rounded to ``dtype`` and back to fp32 (a reduced-precision twin)."""

        def rnd(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype).to(torch.float32)

        embed = rnd(self.embed)
        tied = self.lm_head is self.embed
        layers = tuple(
            replace(layer, **{name: rnd(t) for name, t in layer.tensors().items()}) for layer in self.layers
        )
        return LlamaWeights(
            embed=embed, layers=layers, norm=rnd(self.norm), lm_head=embed if tied else rnd(self.lm_head)
        )


def random_weights(config: LlamaConfig, seed: int) -> LlamaWeights:
    """Seeded random fp32 weights (scaled so activations stay O(1)); for tests that need no GGUF."""
    gen = torch.Generator().manual_seed(seed)
    h, d = config.hidden_size, config.head_dim

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / math.sqrt(cols)

    def gain(size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=gen)

    layers = tuple(
        LayerWeights(
            attn_norm=gain(h),
            wq=mat(config.num_heads * d, h),
            wk=mat(config.num_kv_heads * d, h),
            wv=mat(config.num_kv_heads * d, h),
            wo=mat(h, config.num_heads * d),
            ffn_norm=gain(h),
            w_gate=mat(config.intermediate_size, h),
            w_up=mat(config.intermediate_size, h),
            w_down=mat(h, config.intermediate_size),
        )
        for _ in range(config.num_layers)
    )
    # Tied logits have a standard deviation of about 2: peaked enough to be model-like, spread enough that
    # every token of a tiny vocabulary keeps visible mass (statistical tests need both).
    embed = 2.0 * mat(config.vocab_size, h)
    lm_head = embed if config.tie_embeddings else 2.0 * mat(config.vocab_size, h)
    return LlamaWeights(embed=embed, layers=layers, norm=gain(h), lm_head=lm_head)
