"""Round ids: the id the controller derives for a round, and the form reserved for such ids.

A round the caller does not name is named after what it proposes: ``g<published generation>-<16 hex>``,
the hex being the start of ``sha256("<coordinate digest>|<draft ids, comma-separated>")``. The same
coordinate and drafts at the same generation name the same round, so a retried round is recognised as the
one already published.

Ids of that form (``g``, a generation from 1, ``-``, 16 lowercase hex digits) are reserved for derived ids:
a round may carry one only when it is the round's own derived id (:func:`check_round_id`). The SQL log
relies on it: it stores a derived id as the empty string and rebuilds it from the round's coordinate digest
and drafts on reading, so a caller's id of the same form could otherwise name a later round's id too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from specround.errors import InvalidRequestError

__all__ = ["check_round_id", "derived_generation", "derived_round_id"]

_RESERVED = re.compile(r"g([1-9][0-9]*)-[0-9a-f]{16}")
"""The form of derived round ids."""


def derived_round_id(generation: int, coordinate_digest: str, draft_ids: Sequence[int]) -> str:
    """The id of a round that starts at ``generation`` (it publishes ``generation + 1``) with these drafts."""
    text = f"{coordinate_digest}|{','.join(map(str, draft_ids))}"  # one buffer: the bytes always hashed
    # A hex digest is ASCII, whose UTF-8 bytes are its ASCII bytes; any other text still hashes (to an id
    # that names no round the log holds) instead of raising.
    data = text.encode("utf-8", "surrogatepass")
    return f"g{generation + 1}-{hashlib.sha256(data).hexdigest()[:16]}"


def derived_generation(round_id: str) -> int | None:
    """The generation an id of the reserved form publishes (None for an id of any other form)."""
    match = _RESERVED.fullmatch(round_id)
    return int(match.group(1)) if match is not None else None


def check_round_id(round_id: str, generation: int, coordinate_digest: str, draft_ids: Sequence[int]) -> bool:
    """Whether ``round_id`` is the round's derived id; :class:`InvalidRequestError` if it only has the form.

    ``generation`` is the generation the round starts at. Any id that does not have the reserved form is
    the caller's own (False).
    """
    if _RESERVED.fullmatch(round_id) is None:
        return False
    if round_id == derived_round_id(generation, coordinate_digest, draft_ids):
        return True
    raise InvalidRequestError(
        f"round id {round_id!r} has the form reserved for derived round ids (g<generation>-<16 hex>) but is "
        f"not the id derived from this round's generation {generation}, coordinate digest and drafts"
    )
