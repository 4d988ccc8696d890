"""The report page: one self-contained ``index.html`` that links the PNG figures beside it.

Rendered with jinja2 (autoescaped); no script, no external resource, so the page opens from a file in any
browser and can be archived with its directory.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import jinja2

from specround.audit.audit_report import AuditReport
from specround.report.aggregate import ReportData

__all__ = ["INVARIANTS", "render_html"]

INVARIANTS: dict[str, str] = {
    "INV-1": "Frontier shape: C == O[:-1], F == O[-1]",
    "INV-2": "Output growth min(A + 1, H); nothing after a stop",
    "INV-3": "Target-side RNG draws = reached tests + terminal",
    "INV-4": "Stateful processors advance over published tokens only",
    "INV-5": "K/V commits [F_0] + d_1..d_A only",
    "INV-6": "Publication is a compare-and-swap on the generation",
    "INV-7": "Failures before publication change nothing",
    "INV-8": "Replay reproduces the live state exactly",
    "INV-9": "Unbroken per-request hash chain",
    "INV-10": "Every decision re-derives from the logged values",
}
"""The invariants of specs/invariants.md, as the verdict table names them."""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>specround audit report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; font-size: 0.92em; }
th { background: #f3f3f3; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
figure { margin: 1em 0 2em; } figcaption { font-size: 0.9em; color: #555; max-width: 60em; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f6f6f6; padding: 0 0.2em; }
</style></head><body>
<h1>specround audit report</h1>
<p>Log <code>{{ log }}</code>, generated {{ generated }}.
{% if filters %}Filters:
{% for k, v in filters.items() %}<code>{{ k }} = {{ v }}</code> {% endfor %}
{% else %}No filters.{% endif %}</p>

<h2>Verdict</h2>
{% if audit is none %}
<p>No audit was run for this report.</p>
{% else %}
<p class="{{ 'ok' if audit.ok else 'bad' }}">{{ 'Clean' if audit.ok else 'Findings' }}:
{{ audit.requests }} requests, {{ audit.events }} events, {{ audit.rounds }} rounds re-derived;
hash chains: <span class="{{ 'ok' if audit.chain_ok else 'bad' }}">
{{- 'intact' if audit.chain_ok else 'BROKEN' }}</span>.</p>
<table><tr><th>invariant</th><th>what</th><th>verdict</th></tr>
{% for inv in audit.invariants %}<tr><td>{{ inv.name }}</td><td>{{ inv.text }}</td>
<td class="{{ 'ok' if inv.count == 0 else 'bad' }}">
{{- 'held' if inv.count == 0 else inv.count ~ ' finding(s)' }}</td></tr>
{% endfor %}</table>
{% if audit.findings %}<table><tr><th>invariant</th><th>kind</th><th>request</th><th>seq</th>
<th>round</th><th>message</th></tr>
{% for f in audit.findings %}<tr><td>{{ f.invariant }}</td><td>{{ f.kind }}</td>
<td>{{ f.request_id }}</td><td>{{ f.seq if f.seq is not none else '-' }}</td>
<td>{{ f.round_id or '-' }}</td><td>{{ f.message }}</td></tr>
{% endfor %}</table>
{% if audit.more %}<p>... and {{ audit.more }} more findings
(see <code>specround audit --json</code>).</p>{% endif %}{% endif %}
{% endif %}

<h2>Summary</h2>
<table>
{% for k, v in summary %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>
{% endfor %}</table>

<h2>Accepted prefix (contract#accepted-prefix)</h2>
<figure><img src="{{ figures.survival }}" alt="survival curve">
<figcaption>Survival <code>s_j = Pr(A &ge; j)</code> as the product of the reach-conditioned rates
(the Kaplan-Meier product-limit estimator: rounds that drafted fewer tokens or stopped inside their
accepted prefix are censored, not failed). The band is pointwise 95%: Greenwood's variance on the
log(-log) scale; where no rejection has happened yet it is the Wilson bound of "no rejection in the
smallest risk set". The grey line counts <code>Pr(A &ge; j | k &ge; j)</code> directly.</figcaption>
</figure>
<figure><img src="{{ figures.accepted_pmf }}" alt="accepted-count law">
<figcaption><code>Pr(A = a) = s_a - s_(a+1)</code> (last: <code>s_K</code>) from the tail above;
dots: the observed frequencies among rounds of each draft length k.</figcaption></figure>
<figure><img src="{{ figures.reach_rates }}" alt="reach-conditioned rates">
<figcaption><code>alpha_j^reach = accepted_j / reached_j</code> over the rounds whose test j actually
ran, with Wilson 95% intervals. The grey line divides by every proposed row at j, reached or not: a
different quantity, shown only for contrast.</figcaption></figure>
<table><tr><th>j</th><th>reached</th><th>accepted</th><th>alpha_j^reach</th><th>95% interval</th>
<th>s_j</th><th>s_j band</th></tr>
{% for row in positions %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>

<h2>Acceptance by request and over time</h2>
<figure><img src="{{ figures.requests }}" alt="acceptance by request">
<figcaption>Accepted over drafted tokens per request ({{ requests_shown }}).</figcaption></figure>
{% if lowest %}<table><tr><th>request (lowest acceptance)</th><th>rounds</th><th>drafted</th>
<th>accepted</th><th>accepted / drafted</th></tr>
{% for r in lowest %}<tr>{% for cell in r %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}
<figure><img src="{{ figures.over_time }}" alt="acceptance over time">
<figcaption>Per time bucket of {{ bucket_width }} (publication time).</figcaption></figure>

<h2>Time ledger (contract#time-ledger)</h2>
<figure><img src="{{ figures.time_ledger }}" alt="time ledger">
<figcaption>Mean draft, verify, state and queue seconds per round, and time per committed token as the
renewal-reward ratio <code>sum T_round / sum G</code> per bucket
(not <code>mean(T_round / G)</code>).</figcaption></figure>

<h2>Temporary versus committed K/V rows (contract#temporary-rows)</h2>
<figure><img src="{{ figures.kv_rows }}" alt="verify and committed rows">
<figcaption>Temporary rows are the verification pass's input rows (k + 1 under replay_frontier, k under
retained_frontier); committed rows are the K/V rows the round kept
(<code>[F_0] + d_1..d_A</code>, INV-5).</figcaption></figure>
</body></html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_PAGE = _ENV.from_string(_TEMPLATE)
_MAX_FINDINGS = 200
_LOWEST = 10


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _width(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return dt.datetime.fromtimestamp(at, tz=dt.UTC).isoformat(timespec="seconds")


def _audit_context(audit: AuditReport | None) -> dict[str, Any] | None:
    if audit is None:
        return None
    counts = audit.counts()
    findings = audit.findings
    return {
        "ok": audit.ok,
        "requests": len(audit.requests),
        "events": audit.events,
        "rounds": audit.rounds,
        "chain_ok": counts.get("INV-9", 0) == 0,
        "invariants": [
            {"name": name, "text": text, "count": counts.get(name, 0)} for name, text in INVARIANTS.items()
        ],
        "findings": findings[:_MAX_FINDINGS],
        "more": max(0, len(findings) - _MAX_FINDINGS),
    }


def render_html(
    data: ReportData,
    figures: dict[str, str],
    *,
    log: str,
    filters: dict[str, Any],
    audit: AuditReport | None,
) -> str:
    """The page's HTML text."""
    tpt = data.time_per_token
    summary = [
        ("rounds", f"{data.rounds:,}"),
        ("requests (finished)", f"{data.requests:,} ({data.finished_requests:,})"),
        ("published", f"{_when(data.first_at)} .. {_when(data.last_at)}"),
        ("drafted / accepted / emitted tokens", f"{data.drafted:,} / {data.accepted:,} / {data.emitted:,}"),
        ("mean A, mean G per round", f"{_fmt(data.mean_accepted)}, {_fmt(data.mean_progress)}"),
        ("E[G] = 1 + sum s_j (no stops)", _fmt(data.expected_progress)),
        ("terminals", ", ".join(f"{k}: {v:,}" for k, v in data.terminals.items()) or "-"),
        (
            "time per committed token (sum T / sum G)",
            "-" if tpt is None else f"{tpt * 1e3:.4g} ms over {data.timed_rounds:,} timed rounds",
        ),
        (
            "mean(T / G), for contrast",
            "-"
            if data.mean_time_per_token_ratio is None
            else f"{data.mean_time_per_token_ratio * 1e3:.4g} ms",
        ),
        (
            "time totals (draft / verify / state / queue)",
            " / ".join(f"{v:.4g} s" for v in data.time_totals.values()),
        ),
        (
            "verify rows / committed rows / discarded draft rows",
            f"{data.verify_rows:,} / {data.committed_rows:,} / {data.discarded_rows:,}",
        ),
        (
            "verify rows per committed token",
            _fmt(data.verify_rows / data.emitted if data.emitted else None),
        ),
    ]
    survival = {p.position: p for p in data.survival}
    positions = []
    for p in data.positions:
        s = survival.get(p.position)
        positions.append(
            (
                p.position,
                f"{p.reached:,}",
                f"{p.accepted:,}",
                _fmt(p.rate),
                f"[{p.low:.4f}, {p.high:.4f}]" if p.rate is not None else "-",
                _fmt(s.survival) if s else "-",
                f"[{s.low:.4f}, {s.high:.4f}]" if s else "-",
            )
        )
    rated = [r for r in data.per_request if r.acceptance is not None]
    lowest = sorted(rated, key=lambda r: (r.acceptance or 0.0, -r.rounds))[:_LOWEST]
    width = data.buckets[0].width if data.buckets else 0.0
    return _PAGE.render(
        log=log,
        generated=dt.datetime.now(tz=dt.UTC).isoformat(timespec="seconds"),
        filters=filters,
        audit=_audit_context(audit),
        summary=summary,
        figures=figures,
        positions=positions,
        requests_shown=f"{len(rated):,} requests that drafted",
        lowest=[(r.request_id, r.rounds, r.drafted, r.accepted, _fmt(r.acceptance)) for r in lowest],
        bucket_width=_width(width),
    )
