"""Start-up cache entries and the tokenizer builder, on a tiny model and a hand-made byte-level vocabulary
(fast; the real GGUF round trip lives in ``test_llama_gguf``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTokenizer
from specround.adapters.llama.store import CachedModel, discard_entry, entry_key, read_entry, write_entry
from specround.adapters.llama.tokenizer import CONTROL_TOKEN_TYPE, TokenizerSpec
from specround.errors import ModelLoadError


def tiny_spec(**overrides: object) -> TokenizerSpec:
    # ids: 0 "<eos>" (control), 1 "a", 2 "b", 3 "Ġ", 4 "ab", 5 "Ġa", 6 "1", 7 "2"
    fields: dict[str, object] = dict(
        model="gpt2",
        pre="smollm",
        tokens=("<eos>", "a", "b", "Ġ", "ab", "Ġa", "1", "2"),
        token_types=(CONTROL_TOKEN_TYPE, 1, 1, 1, 1, 1, 1, 1),
        merges=("a b", "Ġ a"),
        bos_id=None,
        eos_id=0,
        unk_id=None,
        pad_id=None,
        eot_id=None,
        add_bos=False,
        chat_template=None,
    )
    fields.update(overrides)
    return TokenizerSpec(**fields)  # type: ignore[arg-type]


def test_byte_level_bpe_from_spec() -> None:
    tok = LlamaTokenizer.from_spec(tiny_spec())
    assert tok.encode("ab a") == [4, 5]
    assert tok.encode("ab<eos>") == [4, 0]  # a control token stays whole
    assert tok.encode("12") == [6, 7]
    assert tok.decode([4, 5, 0], skip_special_tokens=True) == "ab a"
    assert tok.stop_ids == (0,) and tok.vocab_size == 8
    assert tok.token(5) == "Ġa" and tok.token_id("ab") == 4
    with pytest.raises(ModelLoadError):
        LlamaTokenizer.from_spec(tiny_spec(model="llama"))
    with pytest.raises(ModelLoadError):
        LlamaTokenizer.from_spec(tiny_spec(merges=("ab",)))


def test_entry_round_trip_and_damage(tmp_path: Path, tiny: LlamaBundle) -> None:
    tok = LlamaTokenizer.from_spec(tiny_spec())
    entry = CachedModel(
        name="tiny",
        key="k" * 32,
        config=tiny.config,
        weights=tiny.model.weights,
        tokenizer=tok,
        chat_template="{{ messages[0]['content'] }}",
    )
    assert read_entry(tmp_path, entry.key) is None
    assert write_entry(tmp_path, entry)
    assert [p.name for p in tmp_path.iterdir()] == [f"gguf-{entry.key}"]  # no staging directory left
    back = read_entry(tmp_path, entry.key)
    assert back is not None and back.config == tiny.config and back.chat_template == entry.chat_template
    for name, tensor in tiny.model.weights.state_dict().items():
        assert torch.equal(back.weights.state_dict()[name], tensor)
    assert back.weights.lm_head is back.weights.embed  # tied weights stay tied
    assert back.tokenizer.encode("ab a") == [4, 5] and back.tokenizer.eos_id == 0

    (tmp_path / f"gguf-{entry.key}" / "meta.json").write_text("{not json")
    assert read_entry(tmp_path, entry.key) is None  # damaged: a miss, never an exception
    discard_entry(tmp_path, entry.key)
    assert list(tmp_path.iterdir()) == []
    assert write_entry(tmp_path, entry) and read_entry(tmp_path, entry.key) is not None


def test_entry_key_follows_content_and_mtime(tmp_path: Path) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF" + bytes(100))
    first = entry_key(file)
    assert entry_key(file) == first
    file.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    assert entry_key(file) != first
