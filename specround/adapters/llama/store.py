"""Start-up cache: a converted fp32 copy of a GGUF file, so that later loads skip parsing and dequantising.

Entries live under ``$SPECROUND_CACHE_DIR``, else ``$XDG_CACHE_HOME/specround``, else ``~/.cache/specround``,
one directory per source file keyed by the file's size, modification time and the SHA-256 of its first MiB
(plus :data:`FORMAT_VERSION`). An entry is written into a temporary directory and renamed into place, so a
reader never sees a half-written entry and two writers racing leave one complete copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specround.adapters.llama.config import LlamaConfig
from specround.adapters.llama.tokenizer import LlamaTokenizer
from specround.adapters.llama.weights import LlamaWeights
from specround.errors import ModelLoadError

__all__ = [
    "FORMAT_VERSION",
    "CachedModel",
    "cache_root",
    "discard_entry",
    "entry_key",
    "read_entry",
    "write_entry",
]

FORMAT_VERSION = 1
"""Bumped whenever the converted layout changes; part of every key."""
_HEADER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class CachedModel:
    """Everything a load needs, as stored in (or read from) one cache entry."""

    name: str
    key: str
    config: LlamaConfig
    weights: LlamaWeights
    tokenizer: LlamaTokenizer
    chat_template: str | None


def cache_root() -> Path:
    """The directory that holds cache entries (not created here)."""
    explicit = os.environ.get("SPECROUND_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "specround"


def entry_key(gguf_path: Path) -> str:
    """Key of a source file: digest of (format version, size, mtime_ns, SHA-256 of the first MiB)."""
    stat = gguf_path.stat()
    with gguf_path.open("rb") as handle:
        header = hashlib.sha256(handle.read(_HEADER_BYTES)).hexdigest()
    material = f"{FORMAT_VERSION}:{stat.st_size}:{stat.st_mtime_ns}:{header}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def read_entry(root: Path, key: str) -> CachedModel | None:
    """Load an entry, or None if it is absent or unreadable (an unreadable entry is treated as a miss)."""
    entry = root / f"gguf-{key}"
    try:
        meta: dict[str, Any] = json.loads((entry / "meta.json").read_text())
        config = LlamaConfig(**meta["config"])
        state = torch.load(entry / "weights.pt", mmap=True, weights_only=True)
        weights = LlamaWeights.from_state_dict(state, config.num_layers)
        weights.validate(config)
        special = meta["tokenizer"]
        tokenizer = LlamaTokenizer.from_json(
            (entry / "tokenizer.json").read_text(),
            bos_id=special["bos_id"],
            eos_id=special["eos_id"],
            eot_id=special["eot_id"],
            add_bos=special["add_bos"],
        )
    except (
        OSError,
        EOFError,
        KeyError,
        TypeError,
        ValueError,
        RuntimeError,
        pickle.UnpicklingError,
        ModelLoadError,
    ):
        return None  # absent, half-deleted or damaged: a miss (see :func:`discard_entry`)
    return CachedModel(
        name=str(meta["name"]),
        key=key,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        chat_template=meta.get("chat_template"),
    )


def write_entry(root: Path, model: CachedModel) -> bool:
    """Store an entry atomically; returns False (and leaves nothing behind) if the cache is not writable."""
    final = root / f"gguf-{model.key}"
    if final.exists():
        return True
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{model.key}-", dir=root))
    except OSError:
        return False
    try:
        torch.save(model.weights.state_dict(), staging / "weights.pt")
        (staging / "tokenizer.json").write_text(model.tokenizer.to_json())
        meta = {
            "format_version": FORMAT_VERSION,
            "name": model.name,
            "config": model.config.to_dict(),
            "chat_template": model.chat_template,
            "tokenizer": {
                "bos_id": model.tokenizer.bos_id,
                "eos_id": model.tokenizer.eos_id,
                "eot_id": model.tokenizer.eot_id,
                "add_bos": model.tokenizer.add_bos,
            },
        }
        # meta.json is written last: an entry without it is never read as complete.
        (staging / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        os.rename(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return final.exists()
    return True


def discard_entry(root: Path, key: str) -> None:
    """Remove an entry (a damaged one, before it is rewritten).

    The entry is renamed away first, so that no reader ever sees it half-deleted.
    """
    final = root / f"gguf-{key}"
    if not final.exists():
        return
    try:
        trash = Path(tempfile.mkdtemp(prefix=f".trash-{key}-", dir=root))
        os.rename(final, trash / "entry")
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)
