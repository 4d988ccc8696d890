"""Re-derive every logged decision from the logged values and the counter-based RNG (INV-10, INV-2).

:class:`DecisionAuditor` is a replay observer (:data:`~specround.statemachine.replay.RoundObserver`): replay
hands it every round it accepted, with S_0 (and its processor chain) and the round's payloads. Checks that
need only Python run at once; the RNG and acceptance checks are batched per request in :meth:`finish`, or
over many requests at once in :func:`finish_all`:

* uniforms: ``u_i == Philox(seed, ACCEPT, accept_counter + i)`` for every reached test and
  ``u_T == Philox(seed, TERMINAL, terminal_counter)`` — bit-exact;
* acceptance: ``accepts(u_i, p_i(d_i), q_i(d_i))`` (the sampler's own predicate) holds for the accepted
  tests and fails for the rejected one;
* emitted tokens: ``d_1..d_A`` plus the terminal token, or the truncated prefix ``d_1..d_s`` after a stop;
* terminal draw: the inverse-CDF bracket ``mass_before <= u_T * Z < mass_before + token_mass`` (up to the
  sampler's documented top-end rounding clamp), a positive token mass consistent with the logged ``p`` and
  ``q`` of the token (the residual ``max(p - q, 0)`` for a correction, ``p`` for a bonus or a degenerate
  correction), the row index (``A`` or ``k``), and a correction that differs from the rejected draft;
* stops (INV-2): no emitted token but the last completes a stop sequence (stop sets of S_0's processors along
  the emitted path); the request finishes exactly when the last token is a stop or the budget is reached,
  with the matching reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from specround.audit.audit_report import AuditFinding
from specround.sampling.exact import accepts
from specround.sampling.processors.processor import StopAutomaton
from specround.sampling.rng import uniforms_host
from specround.sampling.types import Stream
from specround.statemachine.invariants import emission_respects_stops
from specround.statemachine.replay import ReplayedRound

__all__ = ["DecisionAuditor", "finish_all"]

_Find = Callable[[str, str, str], None]
"""``find(invariant, kind, message)`` records a finding of the round being checked."""

_EPS64 = float(torch.finfo(torch.float64).eps)
_CLAMP_ULPS = 16.0
"""Slack of the bracket check, in ulps of the row total: the sampler's top-end rounding clamp."""
_MASS_RTOL = 4.0 * float(torch.finfo(torch.float32).eps)
"""Relative slack between the logged token mass and ``p - q`` re-computed in float64 (float32 rows round
their difference once in float32)."""


def _unreadable(exc: Exception) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"a logged value cannot be checked ({type(exc).__name__}: {text})"


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= (1 << 63) else value


def _refuse_negative(counters: npt.NDArray[np.int64], stream: Stream) -> None:
    """A negative counter raises: the controller never draws one, so the round is reported as malformed."""
    if counters.size and int(counters.min()) < 0:
        raise ValueError(f"a {stream.name} counter is negative: {int(counters.min())}")


@dataclass(slots=True)
class _Draws:
    round_id: str
    seq: int
    seed: int
    accept_counter: int
    logged_uniforms: list[float]
    p_draft: list[float]
    q_draft: list[float]
    expected: list[bool]
    terminal_counter: int | None
    terminal_uniform: float | None


def _tests(draws: list[_Draws]) -> list[tuple[_Draws, int]]:
    """Every reached acceptance test of ``draws``: (its round, the test's 0-based index)."""
    return [(d, i) for d in draws for i in range(len(d.expected))]


@dataclass(frozen=True, slots=True)
class _Rederived:
    """What the RNG and the acceptance rule give for one request's draws, test by test."""

    accept: list[float]
    """The fresh ACCEPT uniform of each reached test (in :func:`_tests` order)."""
    verdicts: list[bool]
    """``accepts(u, p, q)`` of each reached test with its fresh uniform."""
    terminal: list[float]
    """The fresh TERMINAL uniform of each round that drew one, in order."""


def _rederive(draw_sets: list[list[_Draws]]) -> list[_Rederived]:
    """The fresh uniforms and acceptance verdicts of several requests' draws, computed together.

    One Philox call on the host for every ACCEPT and TERMINAL triple, and one acceptance test over every
    reached test, whatever the number of requests: a log of many short requests pays numpy's and torch's
    per-call price once per batch instead of once per request. Raises on any value that cannot be read.
    """
    test_sets = [_tests(draws) for draws in draw_sets]
    terminal_sets = [[d for d in draws if d.terminal_counter is not None] for draws in draw_sets]
    tests = [test for sets in test_sets for test in sets]
    terminal = [d for sets in terminal_sets for d in sets]
    accept_counters = np.array([d.accept_counter + i for d, i in tests], dtype=np.int64)
    terminal_counters = np.array([d.terminal_counter for d in terminal], dtype=np.int64)
    _refuse_negative(accept_counters, Stream.ACCEPT)
    _refuse_negative(terminal_counters, Stream.TERMINAL)
    seeds = np.array(
        [_signed64(d.seed) for d, _ in tests] + [_signed64(d.seed) for d in terminal], dtype=np.int64
    )
    streams = np.repeat(
        np.array([int(Stream.ACCEPT), int(Stream.TERMINAL)], dtype=np.int64), (len(tests), len(terminal))
    )
    counters = np.concatenate((accept_counters, terminal_counters))
    fresh = uniforms_host(seeds, streams, counters) if counters.size else np.zeros(0)
    verdicts: list[bool] = []
    if tests:
        p = torch.tensor([d.p_draft[i] for d, i in tests], dtype=torch.float64)
        q = torch.tensor([d.q_draft[i] for d, i in tests], dtype=torch.float64)
        verdicts = accepts(torch.from_numpy(fresh[: len(tests)].copy()), p, q).tolist()
    values: list[float] = fresh.tolist()
    out = []
    at_test, at_terminal = 0, len(tests)
    for sets, terminal_draws in zip(test_sets, terminal_sets, strict=True):
        n_tests, n_terminal = len(sets), len(terminal_draws)
        out.append(
            _Rederived(
                accept=values[at_test : at_test + n_tests],
                verdicts=verdicts[at_test : at_test + n_tests],
                terminal=values[at_terminal : at_terminal + n_terminal],
            )
        )
        at_test += n_tests
        at_terminal += n_terminal
    return out


def finish_all(auditors: list[DecisionAuditor]) -> list[list[AuditFinding]]:
    """:meth:`DecisionAuditor.finish` of each auditor, their RNG and acceptance checks run as one batch.

    The same findings as finishing each alone: when some value of the batch cannot be read, each request
    is re-derived on its own, which names the round.
    """
    draw_sets = []
    for auditor in auditors:
        draw_sets.append(auditor._draws)
        auditor._draws = []
    rederived: list[_Rederived | None]
    try:
        rederived = list(_rederive(draw_sets))
    except Exception:  # some logged value is not a number: each request on its own
        rederived = [None] * len(auditors)
    return [
        auditor._settle(draws, mine)
        for auditor, draws, mine in zip(auditors, draw_sets, rederived, strict=True)
    ]


class DecisionAuditor:
    """Collects the rounds of one request and re-derives their decisions."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.findings: list[AuditFinding] = []
        self.rounds = 0
        self._draws: list[_Draws] = []

    def _find(self, invariant: str, kind: str, seq: int, round_id: str, message: str) -> None:
        self.findings.append(
            AuditFinding(
                request_id=self.request_id,
                invariant=invariant,
                kind=kind,
                seq=seq,
                round_id=round_id,
                message=message,
            )
        )

    def __call__(self, rnd: ReplayedRound) -> None:
        """Check one replayed round (the replay observer); an unreadable value is a ``malformed`` finding."""
        self.rounds += 1
        try:
            self._check_round(rnd)
        except Exception as exc:  # a field replay does not read holds a value of the wrong type
            self._find("INV-10", "malformed", rnd.seq, rnd.round_id, _unreadable(exc))

    def _check_round(self, rnd: ReplayedRound) -> None:
        ready, verified, decided = rnd.ready, rnd.verified, rnd.decided
        seq, round_id = rnd.seq, rnd.round_id

        def find(invariant: str, kind: str, message: str) -> None:
            self._find(invariant, kind, seq, round_id, message)

        drafts: list[int] = list(ready["draft_ids"])
        k = len(drafts)
        q_draft: list[float] = list(ready["q_draft"])
        p_draft: list[float] = list(verified["p_draft"])
        if len(q_draft) != k or len(p_draft) != k:
            find("INV-10", "acceptance", f"{k} drafts with {len(q_draft)} q and {len(p_draft)} p values")
            return
        accepted: int = decided["accepted"]
        terminal: str = decided["terminal"]
        emitted: list[int] = list(decided["emitted_ids"])
        if accepted > k:
            find("INV-10", "acceptance", f"A = {accepted} > k = {k}")
            return
        # Emitted tokens: the accepted prefix plus the terminal token, or the truncated prefix.
        if terminal == "stop":
            if emitted != drafts[:accepted]:
                find(
                    "INV-10",
                    "emitted",
                    f"stop round emitted {emitted}, not the accepted prefix {drafts[:accepted]}",
                )
        elif emitted[:-1] != drafts[:accepted] or len(emitted) != accepted + 1:
            find(
                "INV-10", "emitted", f"emitted {emitted} is not d_1..d_A = {drafts[:accepted]} plus one token"
            )
        expected = [True] * accepted + ([False] if terminal == "correction" else [])
        if terminal == "correction" and accepted >= k:
            find("INV-10", "acceptance", "a correction with every draft accepted")
            return
        if terminal == "bonus" and accepted != k:
            find("INV-10", "acceptance", f"a bonus after A = {accepted} of {k} drafts")
        seed = rnd.config.seed
        has_terminal = terminal != "stop"
        self._draws.append(
            _Draws(
                round_id=round_id,
                seq=seq,
                seed=seed,
                accept_counter=decided["accept_counter"],
                logged_uniforms=list(decided["accept_uniforms"]),
                p_draft=p_draft[: len(expected)],
                q_draft=q_draft[: len(expected)],
                expected=expected,
                terminal_counter=decided["terminal_counter"] if has_terminal else None,
                terminal_uniform=decided["terminal_uniform"] if has_terminal else None,
            )
        )
        if has_terminal:
            self._check_terminal(decided, drafts, accepted, terminal, find)
        self._check_stops(rnd, emitted, decided, find)

    def _check_terminal(
        self, decided: dict[str, Any], drafts: list[int], accepted: int, terminal: str, find: Any
    ) -> None:
        u, z = decided["terminal_uniform"], decided["residual_mass"]
        before, mass = decided["terminal_mass_before"], decided["terminal_token_mass"]
        p_t, q_t = decided["terminal_p"], decided["terminal_q"]
        token = decided["emitted_ids"][-1]
        if None in (u, z, before, mass, p_t, q_t, decided["terminal_row"]):
            find("INV-10", "terminal", "the terminal draw's bracket or probabilities are missing")
            return
        expected_row = accepted if terminal == "correction" else len(drafts)
        if decided["terminal_row"] != expected_row:
            find("INV-10", "terminal", f"terminal row {decided['terminal_row']}, expected {expected_row}")
        if not (z > 0 and mass > 0):
            find("INV-10", "terminal", f"terminal token drawn with row mass {z} and token mass {mass}")
            return
        target = u * z
        slack = _CLAMP_ULPS * _EPS64 * z
        if not (before - slack <= target < before + mass + slack):
            find(
                "INV-10",
                "terminal",
                f"u * Z = {target!r} outside the token's bracket [{before!r}, {before + mass!r})",
            )
        degenerate = bool(decided.get("degenerate_correction", False))
        if terminal == "correction" and not degenerate:
            expected_mass = max(p_t - q_t, 0.0)
            if token == drafts[accepted]:
                find("INV-10", "terminal", f"the correction {token} is the rejected draft itself")
        else:
            expected_mass = p_t
            if terminal == "bonus" and q_t != 0.0:
                find("INV-10", "terminal", f"a bonus logs q = {q_t!r} for its token")
        if abs(mass - expected_mass) > _MASS_RTOL * max(p_t, q_t, mass):
            source = "max(p - q, 0)" if terminal == "correction" and not degenerate else "p"
            find(
                "INV-10",
                "terminal",
                f"token mass {mass!r} is not {source} = {expected_mass!r} of token {token}",
            )

    def _check_stops(
        self, rnd: ReplayedRound, emitted: list[int], decided: dict[str, Any], find: Any
    ) -> None:
        start = rnd.start
        chain = start.chain
        ends_request = [False] * len(emitted)
        if any(isinstance(p, StopAutomaton) for p in chain.processors):
            sets = chain.stop_sets_along(emitted)
            ends_request = [token in sets[i] for i, token in enumerate(emitted)]
        remaining = rnd.config.max_new_tokens - start.state.generated_count
        finished = bool(decided["finished"])
        for breach in emission_respects_stops(emitted, ends_request, remaining, finished):
            find(breach.invariant, "stop", breach.message)
        last_is_stop = bool(ends_request) and ends_request[-1]
        reason = "stop" if last_is_stop else "length" if len(emitted) >= remaining else None
        if finished == (reason is not None) and decided["finish_reason"] != reason:
            find(
                "INV-2",
                "stop",
                f"logged finish reason {decided['finish_reason']}, the stop sets and budget say {reason}",
            )

    def finish(self) -> list[AuditFinding]:
        """Run the batched RNG and acceptance checks; return every finding of the request."""
        return finish_all([self])[0]

    def _settle(self, draws: list[_Draws], rederived: _Rederived | None) -> list[AuditFinding]:
        """The RNG and acceptance checks of ``draws`` (re-derived already, or here); every finding."""
        kept = len(self.findings)
        try:
            self._judge(draws, rederived if rederived is not None else _rederive([draws])[0])
        except Exception:  # some logged value is not a number: check the rounds one by one to name it
            del self.findings[kept:]
            for draw in draws:
                kept = len(self.findings)
                try:
                    self._judge([draw], _rederive([[draw]])[0])
                except Exception as exc:
                    del self.findings[kept:]
                    self._find("INV-10", "malformed", draw.seq, draw.round_id, _unreadable(exc))
        return list(self.findings)

    def _judge(self, draws: list[_Draws], rederived: _Rederived) -> None:
        """Compare the logged uniforms and acceptance outcomes of ``draws`` with their re-derivation."""
        tests = _tests(draws)
        logged = [d.logged_uniforms[i] if i < len(d.logged_uniforms) else float("nan") for d, i in tests]
        for (d, i), u_fresh, u_logged, verdict in zip(
            tests, rederived.accept, logged, rederived.verdicts, strict=True
        ):
            if u_fresh != u_logged:
                self._find(
                    "INV-10",
                    "uniform",
                    d.seq,
                    d.round_id,
                    f"ACCEPT uniform {i + 1} is {u_logged!r}, Philox gives {u_fresh!r}",
                )
            if verdict != d.expected[i]:
                word = "accepted" if d.expected[i] else "rejected"
                self._find(
                    "INV-10",
                    "acceptance",
                    d.seq,
                    d.round_id,
                    f"test {i + 1} logged as {word}, but u = {u_fresh!r} "
                    f"vs p/q = {d.p_draft[i]!r}/{d.q_draft[i]!r}",
                )
        for d in draws:
            if len(d.logged_uniforms) != len(d.expected):
                self._find(
                    "INV-10",
                    "uniform",
                    d.seq,
                    d.round_id,
                    f"{len(d.logged_uniforms)} ACCEPT uniforms logged for {len(d.expected)} reached tests",
                )
        terminal = [d for d in draws if d.terminal_counter is not None]
        if terminal:
            for d, u_fresh in zip(terminal, rederived.terminal, strict=True):
                if u_fresh != d.terminal_uniform:
                    self._find(
                        "INV-10",
                        "uniform",
                        d.seq,
                        d.round_id,
                        f"TERMINAL uniform is {d.terminal_uniform!r}, Philox gives {u_fresh!r}",
                    )
