"""An event's canonical JSON text, packed: raw deflate against a preset dictionary of what such texts share.

The ``events`` table holds each request's ``request_opened`` event. Its canonical text is mostly what every
request repeats: key names, defaults, processor skeletons, the layout and softmax names. Deflate (zlib, RFC
1951) primed with :data:`DICTIONARY_V1` stores that part as back-references, so the bytes left are the
request's own values (its id, prompt, digests): a 723-byte ``request_opened`` of the controller bench packs to
166 bytes, a 1,279-byte one of ``specround generate`` (SmolLM2, five processors, a 34-token prompt) to 293.

Layout: byte 0 is the form, :data:`DEFLATE_V1`; the rest is a raw deflate stream (no zlib header or
checksum: the hash chain covers the unpacked text) compressed against :data:`DICTIONARY_V1`. The dictionary
is part of the stored format and never changes; another dictionary would be another form. Unpacking gives
the packed text back byte for byte, so the chain checks it as if it had been stored as text.
"""

from __future__ import annotations

import zlib

__all__ = ["DEFLATE_V1", "DICTIONARY_V1", "MAX_UNPACKED_BYTES", "pack_payload", "unpack_payload"]

DEFLATE_V1 = 1
"""The form byte of a text deflated against :data:`DICTIONARY_V1`."""

MAX_UNPACKED_BYTES = 1 << 26
"""Longest text a packed payload may unpack to (64 MiB, a prompt of millions of tokens): a hostile row cannot
make the reader inflate more."""

_WINDOW_BITS = -15
"""Raw deflate (negative: no zlib header or trailer), 32 KiB window."""

DICTIONARY_V1 = (
    b'"state":{"counts":[]}},{"kind":"stop_sequences","params":{"sequences":[[2]]},"state":{"match":[]}}'
    b'{"kind":"frequency_penalty","params":{"penalty":0.0},"state":{"counts":[]}},{"kind":"presence_penalty",'
    b'{"kind":"min_p","params":{"p":0.05},"state":{}},{"kind":"top_k","params":{"k":50},"state":{}},'
    b'{"kind":"top_p","params":{"p":0.95},"state":{}},'
    b'{"config":{"coordinate":{"backend":{"attention_path":"packed-sdpa","dtype":"float32",'
    b'"software_revision":"specround 0.1.0, torch 2.13.0+cpu"},"draft_model_id":"ngram:1-3",'
    b'"draft_processors_digest":"","target_model_id":"gguf:SmolLM2-135M-Instruct.Q4_1.gguf@","vocab_digest":""},'
    b'{"config":{"coordinate":{"backend":{"attention_path":"unspecified","dtype":"unspecified",'
    b'"software_revision":"unspecified"},"draft_model_id":"unspecified","draft_processors_digest":"unspecified",'
    b'"target_model_id":"unspecified","vocab_digest":"'
    b'"layout":"retained","layout":"replay_frontier","max_new_tokens":,"processors":[{"kind":"repetition_penalty",'
    b'"params":{"penalty":1.1},"state":{"counts":[]}},{"kind":"temperature","params":{"temperature":0.7},'
    b'"state":{}}],"prompt_advances_processors":false,"prompt_advances_processors":true,"prompt_ids":[1,'
    b'"seed":0,"softmax":"max_shift","vocab_size":49152},"initial_state_digest":"","kind":"request_opened",'
    b'"request_id":"","schema_version":1}'
)
"""The preset dictionary of :data:`DEFLATE_V1`: the strings a ``request_opened`` text shares with others,
the most common last (deflate reaches them with the shortest distances). Frozen with the form."""


def pack_payload(text: bytes) -> bytes:
    """The packed form (:data:`DEFLATE_V1`) of a payload's canonical text."""
    packer = zlib.compressobj(9, zlib.DEFLATED, _WINDOW_BITS, 9, zdict=DICTIONARY_V1)
    return bytes((DEFLATE_V1,)) + packer.compress(text) + packer.flush()


def unpack_payload(packed: bytes) -> bytes:
    """The text a packed payload holds, byte for byte.

    Raises ValueError naming what is wrong: an unknown form, a stream that is cut short, corrupt or
    followed by other bytes, or one that would unpack past :data:`MAX_UNPACKED_BYTES`.
    """
    if not packed:
        raise ValueError("the packed payload is empty")
    if packed[0] != DEFLATE_V1:
        raise ValueError(f"the packed payload has the unknown form {packed[0]}")
    unpacker = zlib.decompressobj(_WINDOW_BITS, zdict=DICTIONARY_V1)
    try:
        text = unpacker.decompress(memoryview(packed)[1:], MAX_UNPACKED_BYTES)
    except zlib.error as exc:
        raise ValueError(f"the packed payload is not a deflate stream ({exc})") from None
    if unpacker.unconsumed_tail:
        raise ValueError(f"the packed payload unpacks past {MAX_UNPACKED_BYTES:,} bytes")
    if not unpacker.eof:
        raise ValueError("the packed payload is cut short")
    if unpacker.unused_data:
        raise ValueError(f"the packed payload has {len(unpacker.unused_data)} bytes after its stream")
    return text
