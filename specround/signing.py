"""Signed chain heads: what a log writer holding a key attests, and how an auditor checks it.

Without a key the hash chains prove only that a log is self-consistent: anyone who can write the database
can rebuild a request (or a whole log) with the library and recompute every hash. With a key, the writer
signs each request's head at every group commit (a :class:`SignedClaim` of kind ``head``: request,
generation, head seq and hash, state digest, finished) and, periodically, a ``checkpoint`` over every head
of the log; an auditor holding the same key checks that the current heads, and the chain positions every
signature names, are ones the key holder wrote (:mod:`specround.audit.signatures`).

The scheme is HMAC-SHA256 (:class:`HmacSigner`): the auditor holds the writer's secret, so it proves that
*someone holding the key* wrote the log, not which of the key's holders. Keys come from a file or the
environment variable :data:`KEY_ENV` (:func:`load_key`). A public-key scheme (Ed25519) would let auditors
verify without being able to sign; it is not implemented in this release (see ``specs/threat-model.md``).

Messages are canonical JSON (:func:`~specround.canonical.canonical_bytes`) so that writer and auditor
sign and verify the very same bytes, which the log stores beside the signature.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from specround.canonical import canonical_bytes
from specround.errors import InvalidRequestError

__all__ = [
    "HMAC_SHA256",
    "KEY_ENV",
    "MIN_KEY_BYTES",
    "HmacSigner",
    "LogSigner",
    "SignatureRow",
    "SignedClaim",
    "checkpoint_message",
    "head_message",
    "load_key",
    "parse_claim",
]

HMAC_SHA256 = "hmac-sha256"
"""The scheme name stored with each signature."""
KEY_ENV = "SPECROUND_LOG_KEY"
"""Environment variable holding a signing key (its UTF-8 bytes), used when no key file is given."""
MIN_KEY_BYTES = 16
"""Shortest key accepted (HMAC-SHA256 keys should carry at least 128 bits)."""


class LogSigner(Protocol):
    """Signs and verifies messages; ``key_id`` names the key without revealing it."""

    @property
    def scheme(self) -> str:
        """The scheme name stored with each signature."""
        ...

    @property
    def key_id(self) -> str:
        """A short public fingerprint of the key."""
        ...

    def sign(self, message: bytes) -> str:
        """The hex signature of ``message``."""
        ...

    def verify(self, message: bytes, signature: str) -> bool:
        """Whether ``signature`` is this key's signature of ``message``."""
        ...


@dataclass(frozen=True, slots=True)
class HmacSigner:
    """HMAC-SHA256 with a shared secret key."""

    key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) < MIN_KEY_BYTES:
            raise InvalidRequestError(f"a signing key must hold at least {MIN_KEY_BYTES} bytes")

    @property
    def scheme(self) -> str:
        """``hmac-sha256``."""
        return HMAC_SHA256

    @property
    def key_id(self) -> str:
        """SHA-256 of a domain-separated copy of the key, first 16 hex digits."""
        return hashlib.sha256(b"specround-key-id\x00" + self.key).hexdigest()[:16]

    def sign(self, message: bytes) -> str:
        """HMAC-SHA256 of ``message``, hex."""
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        """Constant-time comparison with a fresh HMAC."""
        return isinstance(signature, str) and hmac.compare_digest(self.sign(message), signature)

    def __repr__(self) -> str:
        return f"HmacSigner(key_id={self.key_id!r})"


def load_key(path: str | os.PathLike[str] | None = None, *, env: str = KEY_ENV) -> bytes | None:
    """A signing key from ``path`` (its bytes, one trailing newline dropped) or from ``env``; None if neither.

    Raises :class:`InvalidRequestError` for an unreadable or short key.
    """
    if path is not None:
        try:
            key = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidRequestError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
        key = key.removesuffix(b"\n").removesuffix(b"\r")
    else:
        text = os.environ.get(env)
        if not text:
            return None
        key = text.encode("utf-8", "surrogateescape")
    if len(key) < MIN_KEY_BYTES:
        raise InvalidRequestError(
            f"the signing key holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed"
        )
    return key


@dataclass(frozen=True, slots=True)
class SignatureRow:
    """One stored signature (see :mod:`specround.signing`); ``defect`` names a row that cannot be read."""

    id: int
    scope: str
    request_id: str | None
    scheme: str
    key_id: str
    message: bytes
    signature: str
    defect: str | None = None


@dataclass(frozen=True, slots=True)
class SignedClaim:
    """What one signature attests, parsed back from its stored message."""

    kind: Literal["head", "checkpoint"]
    heads: tuple[tuple[str, int, int, str, str, bool], ...]
    """(request id, generation, head seq, head hash, state digest, finished) of each head signed."""
    recorded_at: float


def head_message(
    request_id: str, generation: int, seq: int, link: str, state_digest: str, finished: bool, at: float
) -> bytes:
    """The canonical bytes a writer signs for one request's head."""
    return canonical_bytes(
        {
            "kind": "head",
            "heads": [[request_id, generation, seq, link, state_digest, finished]],
            "recorded_at": at,
        }
    )


def checkpoint_message(heads: list[tuple[str, int, int, str, str, bool]], at: float) -> bytes:
    """The canonical bytes a writer signs for a checkpoint of every head of the log."""
    return canonical_bytes(
        {"kind": "checkpoint", "heads": [list(h) for h in sorted(heads)], "recorded_at": at}
    )


def parse_claim(data: Any) -> SignedClaim | None:
    """The claim of a stored message (already JSON-decoded), or None when it is not one."""
    if not isinstance(data, dict) or data.get("kind") not in ("head", "checkpoint"):
        return None
    heads = data.get("heads")
    at = data.get("recorded_at")
    if not isinstance(heads, list) or isinstance(at, bool) or not isinstance(at, (int, float)):
        return None
    out = []
    for head in heads:
        if not isinstance(head, list) or len(head) != 6:
            return None
        rid, generation, seq, link, digest, finished = head
        if not (
            isinstance(rid, str)
            and isinstance(generation, int)
            and isinstance(seq, int)
            and isinstance(link, str)
            and isinstance(digest, str)
            and isinstance(finished, bool)
        ):
            return None
        out.append((rid, generation, seq, link, digest, finished))
    return SignedClaim(kind=data["kind"], heads=tuple(out), recorded_at=float(at))
