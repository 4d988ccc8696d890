"""The report's data path: streaming extraction (SQL and port agree), the fold, the interval estimates."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog
from specround.errors import ReportOptionError
from specround.model_check.ledger_estimate import RoundRecord, estimate_ledger
from specround.report import (
    ReportFilter,
    RoundFold,
    RoundRow,
    fold_rounds,
    kaplan_meier,
    port_round_rows,
    sql_round_rows,
    wilson_interval,
    write_report,
)
from specround.report.aggregate import MAX_BUCKETS
from specround.report.synthetic import SYNTHETIC_MODELS, SyntheticLogSummary, write_synthetic_log


def _key(row: RoundRow) -> tuple[str, float, int]:
    return (row.request_id, row.recorded_at, row.emitted)


def _sorted(rows: object) -> list[RoundRow]:
    return sorted(rows, key=_key)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def sql_log(synthetic_log: tuple[Path, SyntheticLogSummary]) -> SqlEventLog:
    log = SqlEventLog.open(synthetic_log[0], create=False)
    yield log  # type: ignore[misc]
    log.close()


def test_synthetic_log_is_valid_and_audits_clean(
    sql_log: SqlEventLog, synthetic_log: tuple[Path, SyntheticLogSummary]
) -> None:
    from specround.audit import audit_log

    summary = synthetic_log[1]
    assert summary.rounds == 900 and summary.requests > 60  # budgets end requests; slots reopen
    report = audit_log(sql_log)
    assert report.ok, report.findings[:3]
    assert report.rounds == 900


def test_sql_rows_equal_port_rows(sql_log: SqlEventLog) -> None:
    sql = _sorted(sql_round_rows(sql_log))
    port = _sorted(port_round_rows(sql_log))
    assert len(sql) == 900
    assert sql == port
    # Every row obeys the round contract it was logged under (INV-2, INV-3, INV-5).
    for row in sql:
        assert row.emitted == min(row.accepted + 1, row.emitted) and row.emitted >= 1
        assert row.reached in (row.accepted, row.accepted + 1)
        assert row.committed_rows == row.emitted  # replay_frontier: [F_0] + the accepted drafts kept
        assert row.verify_rows == row.drafted + 1
        assert row.round_s is not None and row.round_s > 0


def test_filters_agree_between_sql_and_port(sql_log: SqlEventLog) -> None:
    rows = _sorted(sql_round_rows(sql_log))
    times = sorted({r.recorded_at for r in rows})
    middle = times[len(times) // 3], times[2 * len(times) // 3]
    some = tuple(sorted({r.request_id for r in rows})[:5])
    cases = [
        ReportFilter(request_ids=some),
        ReportFilter(since=middle[0]),
        ReportFilter(until=middle[1]),
        ReportFilter(since=middle[0], until=middle[1]),
        ReportFilter(target_model=SYNTHETIC_MODELS[0]),
        ReportFilter(target_model=SYNTHETIC_MODELS[1], since=middle[0]),
        ReportFilter(draft_model="no-such-draft"),
    ]
    for filters in cases:
        sql = _sorted(sql_round_rows(sql_log, filters))
        assert sql == _sorted(port_round_rows(sql_log, filters)), filters
        expected = [
            r
            for r in rows
            if (not filters.request_ids or r.request_id in filters.request_ids)
            and filters.admits_time(r.recorded_at)
        ]
        if filters.target_model is None and filters.draft_model is None:
            assert sql == expected, filters
    # a request filter and a model filter together: the named requests of that model, no other
    first = {r.request_id for r in sql_round_rows(sql_log, ReportFilter(target_model=SYNTHETIC_MODELS[0]))}
    second = {r.request_id for r in sql_round_rows(sql_log, ReportFilter(target_model=SYNTHETIC_MODELS[1]))}
    named = tuple(sorted(first)[:3] + sorted(second)[:2])
    both = ReportFilter(request_ids=named, target_model=SYNTHETIC_MODELS[0])
    sql = _sorted(sql_round_rows(sql_log, both))
    assert sql == _sorted(port_round_rows(sql_log, both))
    assert {r.request_id for r in sql} == set(sorted(first)[:3])
    by_model = [len(list(sql_round_rows(sql_log, ReportFilter(target_model=m)))) for m in SYNTHETIC_MODELS]
    assert sum(by_model) == 900 and min(by_model) > 0
    assert list(sql_round_rows(sql_log, ReportFilter(draft_model="no-such-draft"))) == []


def test_fold_matches_the_model_check_ledger_estimate(sql_log: SqlEventLog) -> None:
    rows = list(sql_round_rows(sql_log))
    data = fold_rounds(rows)
    records = [
        RoundRecord(
            accepted=r.accepted,
            drafted=r.drafted,
            emitted=r.emitted,
            stopped=r.finished,
            t_draft=r.draft_s or 0.0,
            t_verify=r.verify_s or 0.0,
            t_state=r.state_s or 0.0,
            t_queue=r.queue_s or 0.0,
        )
        for r in rows
    ]
    estimate = estimate_ledger(records)
    # Reach counts: the logged ACCEPT draws equal the ledger's reached tests (INV-3).
    assert [(p.reached, p.accepted) for p in data.positions] == [
        (c.reached, c.accepted) for c in estimate.reach
    ]
    assert [p.survival for p in data.survival] == pytest.approx(list(estimate.survival[1:]), abs=1e-12)
    assert list(data.accepted_pmf) == pytest.approx(list(estimate.accepted_pmf), abs=1e-12)
    assert data.time_per_token == pytest.approx(estimate.time_per_token, rel=1e-9)
    assert data.mean_time_per_token_ratio == pytest.approx(estimate.mean_time_per_token_ratio, rel=1e-9)
    assert data.rounds == 900 and data.emitted == sum(r.emitted for r in rows)
    assert sum(data.terminals.values()) == 900
    # The synthetic profile is front-loaded: alpha_j^reach falls with j (contract#acceptance-profiles).
    rates = [p.rate for p in data.positions]
    assert all(a is not None and b is not None and a > b for a, b in itertools.pairwise(rates))


def test_bucket_totals_are_preserved_and_bounded() -> None:
    fold = RoundFold()
    base = 1_700_000_000.0
    rows = [
        RoundRow(
            f"r{i % 7}",
            base + (i**1.7) * 0.01,
            3,
            4,
            i % 4,
            min(3, i % 4 + 1),
            "correction",
            i % 4 + 1,
            False,
            i % 4 + 1,
            3 - i % 4,
            0.001,
            0.002,
            0.0005,
            0.0001,
        )
        for i in range(3000)
    ]
    for row in reversed(rows):  # arrival order is not time order
        fold.add(row)
    data = fold.finish()
    assert len(data.buckets) <= MAX_BUCKETS
    assert sum(b.rounds for b in data.buckets) == 3000
    assert sum(b.emitted for b in data.buckets) == sum(r.emitted for r in rows)
    assert math.isclose(sum(b.round_s for b in data.buckets), sum(r.round_s or 0 for r in rows), rel_tol=1e-9)
    starts = [b.start for b in data.buckets]
    assert starts == sorted(starts)
    for row in rows:  # every row falls inside the bucket range
        assert starts[0] <= row.recorded_at < data.buckets[-1].start + data.buckets[-1].width


def test_wilson_interval_known_values() -> None:
    # Published values of the Wilson score interval at z = 1.96 (no continuity correction).
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.27753, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    low, high = wilson_interval(81, 263)
    assert (low, high) == pytest.approx((0.2553, 0.3662), abs=1e-4)  # Newcombe (1998), 81/263
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_kaplan_meier_product_greenwood_and_censoring() -> None:
    points = kaplan_meier([100, 80, 40, 0], [80, 60, 10, 0])
    assert [p.position for p in points] == [1, 2, 3]  # stops before the first unreached position
    assert [p.survival for p in points] == pytest.approx([0.8, 0.6, 0.15])
    # Greenwood on the log(-log) scale at j = 2, computed by hand.
    var = 20 / (100 * 80) + 20 / (80 * 60)
    spread = 1.959963984540054 * math.sqrt(var) / abs(math.log(0.6))
    assert points[1].low == pytest.approx(0.6 ** math.exp(spread))
    assert points[1].high == pytest.approx(0.6 ** math.exp(-spread))
    for p in points:
        assert 0.0 <= p.low <= p.survival <= p.high <= 1.0
    ones = kaplan_meier([50, 20], [50, 20])
    assert ones[-1].survival == 1.0 and ones[-1].high == 1.0
    assert ones[-1].low == pytest.approx(wilson_interval(20, 20)[0])
    zero = kaplan_meier([10, 5], [5, 0])
    assert zero[-1].survival == 0.0 and zero[-1].low == 0.0 and 0.0 < zero[-1].high <= zero[0].high


def test_memory_log_report_path(tmp_path: Path) -> None:
    log = MemoryEventLog()
    write_synthetic_log(log, 120, batch=12, max_new_tokens=30, seed=1)
    rows = list(port_round_rows(log))
    assert len(rows) == 120
    result = write_report(log, tmp_path / "memory", log_name="memory")
    assert result.data.rounds == 120 and result.index.is_file()


def test_write_report_files_and_refusals(sql_log: SqlEventLog, tmp_path: Path) -> None:
    from specround.audit import audit_log

    audit = audit_log(sql_log)
    out = tmp_path / "report"
    result = write_report(sql_log, out, audit=audit, log_name="synthetic.sqlite")
    page = result.index.read_text(encoding="utf-8")
    assert len(result.figures) == 7
    for path in result.figures.values():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f'src="{path.name}"' in page
    assert 'hash chains: <span class="ok">intact' in page
    assert page.count(">held<") == 10  # every invariant INV-1..INV-10 held
    assert "Kaplan-Meier" in page and "Wilson" in page
    with pytest.raises(ReportOptionError):
        write_report(sql_log, result.index)  # a file, not a directory
    with pytest.raises(ReportOptionError):
        write_report(sql_log, tmp_path / "x", filters=ReportFilter(since=10.0, until=5.0))
    empty = write_report(sql_log, tmp_path / "none", filters=ReportFilter(target_model="nobody"))
    assert empty.data.rounds == 0 and all(p.is_file() for p in empty.figures.values())


@pytest.mark.postgres
def test_sql_rows_on_postgresql(postgres_url: str) -> None:
    with SqlEventLog.open(postgres_url) as log:
        write_synthetic_log(log, 150, batch=15, max_new_tokens=30, seed=2)
        sql = _sorted(sql_round_rows(log))
        assert len(sql) == 150 and sql == _sorted(port_round_rows(log))
        filters = ReportFilter(target_model=SYNTHETIC_MODELS[1])
        assert _sorted(sql_round_rows(log, filters)) == _sorted(port_round_rows(log, filters))
        some = tuple(sorted({r.request_id for r in sql})[:6])
        filters = ReportFilter(request_ids=some, target_model=SYNTHETIC_MODELS[1])
        named = _sorted(sql_round_rows(log, filters))
        assert named and named == _sorted(port_round_rows(log, filters))
