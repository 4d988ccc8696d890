"""How much of a draft model's cache survives a new context: the rows it shares with the tokens.

A draft cache holds the rows of the tokens it was fed. Before drafting from a new context (or after a round
publishes), it keeps the longest prefix it shares with those tokens, less the last token: that token is fed
again so that its logits row is the one the next draft samples from.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["common_prefix", "rows_to_keep"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest prefix ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def rows_to_keep(committed: Sequence[int], tokens: Sequence[int]) -> int:
    """Rows of ``committed`` still valid for ``tokens``, leaving the last of ``tokens`` to feed again."""
    return min(common_prefix(committed, tokens), max(len(tokens) - 1, 0))
