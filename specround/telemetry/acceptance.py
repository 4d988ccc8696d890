"""The acceptance log read back from the event log: one entry per drafted position and per terminal.

Contract: contract#acceptance-log, which asks for ``draft_token, q_prob, p_prob, accept_ratio = min(1, p/q),
uniform_sample, accepted_or_rejected, correction_distribution_id, committed_token_count`` for every drafted
position. The round's events already hold all of it (``round_ready``: drafts and ``q_i(d_i)``;
``round_verified``: ``p_i(d_i)``; ``round_decided``: the uniforms, the outcome and the terminal draw), so the
acceptance log is a *query*, not a second log: :func:`acceptance_log` streams a request's events and yields
:class:`AcceptanceEntry` values.

Per round, the drafted positions ``1..k`` come first:

* ``accepted`` / ``rejected``: the test ran (``uniform`` is its ACCEPT uniform);
* ``unreached``: an earlier test rejected, so this row was never tested (no uniform was drawn);
* ``after_stop``: a stop inside the accepted prefix ended the request before this test.

Then one terminal entry (``position = A + 1`` for a correction, ``k + 1`` for a bonus; none when a stop
ended the round) with the TERMINAL uniform and the id of the distribution the token was drawn from:
``residual(p_i-q_i)+`` for a correction, ``p_i`` for a bonus or a degenerate correction
(contract#degenerate-cases). When the round logged row digests, the id carries the p rows' digest prefix
(``@abcd1234``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from specround.statemachine.ports import EventLog

__all__ = ["AcceptanceEntry", "acceptance_log"]


@dataclass(frozen=True, slots=True)
class AcceptanceEntry:
    """One line of the acceptance log."""

    request_id: str
    round_id: str
    generation: int
    """The generation the round published."""
    position: int
    """Draft position i (1-based); for the terminal entry, the row its token was drawn from."""
    kind: str
    """``draft`` or ``terminal``."""
    token: int | None
    """The draft token d_i, or the terminal token."""
    q_prob: float | None
    """q_i(d_i); for a terminal entry q of the token at the rejected position (0 for a bonus)."""
    p_prob: float | None
    """p_i(d_i); for a terminal entry p of the token in its row."""
    accept_ratio: float | None
    """``min(1, p/q)`` for a draft entry."""
    uniform: float | None
    """The ACCEPT (draft) or TERMINAL uniform; None when no test ran."""
    outcome: str
    """``accepted``, ``rejected``, ``unreached``, ``after_stop``, or the terminal kind."""
    distribution: str
    """Where a terminal token came from (``residual(p_i-q_i)+`` or ``p_i``); ``-`` for drafts."""
    committed_tokens: int
    """Output tokens the round committed (G)."""

    def as_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)


def _distribution(decided: dict[str, Any], verified: dict[str, Any], k: int) -> tuple[int, str]:
    accepted = int(decided["accepted"])
    suffix = f"@{verified['p_rows_digest'][:12]}" if verified.get("p_rows_digest") else ""
    if decided["terminal"] == "correction":
        row = accepted + 1
        if decided.get("degenerate_correction"):
            return row, f"p_{row}{suffix}"
        return row, f"residual(p_{row}-q_{row})+{suffix}"
    return k + 1, f"p_{k + 1}{suffix}"


def _round_entries(
    request_id: str, generation: int, parts: dict[str, dict[str, Any]]
) -> Iterator[AcceptanceEntry]:
    ready, verified, decided = parts["round_ready"], parts["round_verified"], parts["round_decided"]
    round_id = str(ready["round_id"])
    drafts: list[int] = list(ready["draft_ids"])
    q: list[float] = list(ready["q_draft"])
    p: list[float] = list(verified["p_draft"])
    uniforms: list[float] = list(decided["accept_uniforms"])
    accepted = int(decided["accepted"])
    terminal = str(decided["terminal"])
    emitted = len(decided["emitted_ids"])
    for i, token in enumerate(drafts):
        if i < len(uniforms):
            outcome = "accepted" if i < accepted else "rejected"
            uniform: float | None = uniforms[i]
        else:
            outcome = "after_stop" if terminal == "stop" else "unreached"
            uniform = None
        q_i = q[i] if i < len(q) else None
        p_i = p[i] if i < len(p) else None
        ratio = min(1.0, p_i / q_i) if p_i is not None and q_i else None
        yield AcceptanceEntry(
            request_id,
            round_id,
            generation,
            i + 1,
            "draft",
            token,
            q_i,
            p_i,
            ratio,
            uniform,
            outcome,
            "-",
            emitted,
        )
    if terminal == "stop":
        return
    row, distribution = _distribution(decided, verified, len(drafts))
    yield AcceptanceEntry(
        request_id,
        round_id,
        generation,
        row,
        "terminal",
        int(decided["emitted_ids"][-1]),
        decided.get("terminal_q"),
        decided.get("terminal_p"),
        None,
        decided.get("terminal_uniform"),
        terminal,
        distribution,
        emitted,
    )


def acceptance_log(
    log: EventLog, request_id: str, *, since_generation: int = 0, limit: int | None = None
) -> Iterator[AcceptanceEntry]:
    """Stream the acceptance log of one request from its events (rounds publishing > ``since_generation``).

    ``limit`` caps the number of entries. Rounds whose five events are incomplete are skipped (the audit
    reports them by name).
    """
    produced = 0
    pending: dict[str, dict[str, Any]] = {}
    for event in log.events(request_id):
        if event.kind == "request_opened":
            continue
        pending[event.kind] = event.payload
        if event.kind != "round_published":
            continue
        parts, pending = pending, {}
        if len(parts) != 5 or event.generation <= since_generation:
            continue
        for entry in _round_entries(request_id, event.generation, parts):
            yield entry
            produced += 1
            if limit is not None and produced >= limit:
                return
