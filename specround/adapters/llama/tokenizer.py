"""Byte-level BPE tokenizer built from the `tokenizer.ggml.*` fields of a GGUF file (via `tokenizers`).

The pre-tokenizer follows the file's ``tokenizer.ggml.pre`` name the way llama.cpp does. For SmolLM2
(``smollm``) that means digits are split one by one before the GPT-2 byte-level split, exactly as the model's
own tokenizer was trained. (transformers' GGUF converter does not know the ``smollm`` name and falls back
to the plain GPT-2 split; the two agree except where whitespace runs directly precede a digit.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from specround.errors import ModelLoadError

__all__ = ["CONTROL_TOKEN_TYPE", "USER_DEFINED_TOKEN_TYPE", "LlamaTokenizer", "TokenizerSpec"]

CONTROL_TOKEN_TYPE = 3
"""``tokenizer.ggml.token_type`` of control (special) tokens such as ``<|im_end|>``."""
USER_DEFINED_TOKEN_TYPE = 4
"""``tokenizer.ggml.token_type`` of added tokens that are matched whole but are not special."""

_DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_NAMES = frozenset({"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"})


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """The tokenizer fields of a GGUF file."""

    model: str
    """``tokenizer.ggml.model``; only ``gpt2`` (byte-level BPE) is supported."""
    pre: str
    """``tokenizer.ggml.pre``: which pre-tokenizer split the merges were learned with."""
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eot_id: int | None
    add_bos: bool
    chat_template: str | None


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable bytes map to themselves)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


class LlamaTokenizer:
    """Encode/decode text, with the special token ids a generation loop needs."""

    def __init__(
        self,
        backend: Tokenizer,
        *,
        bos_id: int | None,
        eos_id: int | None,
        eot_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        self._backend = backend
        self.bos_id = bos_id
        """Beginning-of-sequence token id, if the vocabulary has one."""
        self.eos_id = eos_id
        """End-of-sequence token id (``<|im_end|>`` for SmolLM2-Instruct)."""
        self.eot_id = eot_id
        """End-of-turn token id, if declared separately."""
        self.add_bos = add_bos
        """Whether :meth:`encode` prepends BOS when asked for special tokens."""

    @classmethod
    def from_spec(cls, spec: TokenizerSpec) -> LlamaTokenizer:
        """Build the tokenizer a GGUF file describes; unsupported kinds raise ModelLoadError."""
        if spec.model != "gpt2":
            raise ModelLoadError(f"tokenizer model {spec.model!r} is not supported (only byte-level 'gpt2')")
        alphabet = _byte_alphabet()
        letters = set(alphabet.values())
        vocab = {
            (token if set(token) <= letters else "".join(alphabet[b] for b in token.encode("utf-8"))): index
            for index, token in enumerate(spec.tokens)
        }
        merges: list[tuple[str, str]] = []
        for merge in spec.merges:
            left, sep, right = merge.partition(" ")
            if not sep or not left or not right:
                raise ModelLoadError(f"malformed BPE merge {merge!r}")
            merges.append((left, right))
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if spec.pre in _DIGITS_FIRST:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        elif spec.pre in _LLAMA3_NAMES:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        types = spec.token_types or (0,) * len(spec.tokens)
        special = [
            AddedToken(tok, normalized=False, special=True)
            for tok, kind in zip(spec.tokens, types, strict=False)
            if kind == CONTROL_TOKEN_TYPE and set(tok) <= letters
        ]
        user = [
            AddedToken(tok, normalized=False, special=False)
            for tok, kind in zip(spec.tokens, types, strict=False)
            if kind == USER_DEFINED_TOKEN_TYPE and tok in vocab
        ]
        backend.add_special_tokens(special)
        backend.add_tokens(user)
        return cls(backend, bos_id=spec.bos_id, eos_id=spec.eos_id, eot_id=spec.eot_id, add_bos=spec.add_bos)

    @classmethod
    def from_json(
        cls, text: str, *, bos_id: int | None, eos_id: int | None, eot_id: int | None, add_bos: bool
    ) -> LlamaTokenizer:
        """Rebuild from :meth:`to_json` output (the start-up cache)."""
        try:
            backend = Tokenizer.from_str(text)
        except Exception as exc:
            raise ModelLoadError(f"cached tokenizer is unreadable: {exc}") from exc
        return cls(backend, bos_id=bos_id, eos_id=eos_id, eot_id=eot_id, add_bos=add_bos)

    def to_json(self) -> str:
        """The backend tokenizer serialised as ``tokenizer.json`` text."""
        return str(self._backend.to_str())

    @property
    def vocab_size(self) -> int:
        """Number of token ids (added tokens included)."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end a generation (EOS, and EOT when declared), without duplicates."""
        ids = [i for i in (self.eos_id, self.eot_id) if i is not None]
        return tuple(dict.fromkeys(ids))

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) stay whole.

        ``add_bos`` defaults to the file's ``add_bos_token`` flag.
        """
        ids = list(self._backend.encode(text, add_special_tokens=False).ids)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of token ids (invalid UTF-8 byte sequences decode to U+FFFD)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token(self, token_id: int) -> str | None:
        """The vocabulary spelling of one id (byte-level alphabet), or None."""
        value = self._backend.id_to_token(token_id)
        return None if value is None else str(value)

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary spelling, or None."""
        value = self._backend.token_to_id(token)
        return None if value is None else int(value)
