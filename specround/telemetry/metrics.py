"""Prometheus metrics of a serving process: vLLM's speculative-decoding names plus this project's own.

**Names.** The four speculative-decoding counters use vLLM's metric names with the ``specround:`` prefix in
place of ``vllm:`` (same suffixes, same meaning, ``position`` 0-based), so dashboards written for vLLM work
after a prefix change. As in vLLM they are Counters, exposed with the ``_total`` suffix:

=========================================================  =================================================
``specround:spec_decode_num_drafts_total``                 published rounds that drafted (k > 0)
``specround:spec_decode_num_draft_tokens_total``           draft tokens proposed (sum of k)
``specround:spec_decode_num_accepted_tokens_total``        draft tokens accepted (sum of A)
``specround:spec_decode_num_accepted_tokens_per_pos_total`` accepted drafts by ``position`` (0-based)
=========================================================  =================================================

This project's own (contract#time-ledger, contract#temporary-rows, contract#serving-telemetry):
``specround:rounds_published_total{terminal}``, ``specround:rounds_acknowledged_total``,
``specround:rounds_unacknowledged_total{fault_point}``, ``specround:rounds_aborted_total{reason,
fault_point}``, ``specround:publish_conflicts_total{kind}`` (the generation compare-and-swap was lost:
``stale_generation``, ``duplicate_round``), ``specround:fence_refusals_total{reason}`` (refused before
publishing: ``stale_coordinate``, ``finished``), the histograms
``specround:round_{draft,verify,state,queue}_seconds``, the K/V ledger
``specround:kv_{temporary,committed}_rows_total`` and ``..._bytes_total``, the output counters
``specround:generation_tokens_total`` and, per ``speculation`` = ``on`` (k > 0) | ``off`` (k = 0),
``specround:output_tokens_total``, ``specround:round_seconds_total`` and the histogram
``specround:time_per_output_token_seconds``. A round published whose acknowledgement was lost (F-6) is counted
only in ``rounds_unacknowledged_total`` (the caller never received its content; the log holds it). TPOT is
observed once per emitted token with that token's share ``T_round / G`` of its round, so the histogram's
``_sum / _count`` is the renewal-reward ratio ``sum T / sum G`` of contract#time-ledger (not ``mean(T / G)``).
Every metric carries a ``model_name`` label.

Each :class:`SpecroundMetrics` owns its registry (by default a fresh one), so several can live in one
process; :func:`serve_metrics` exposes a registry over HTTP on the loopback interface.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from specround.telemetry.observation import RoundObservation

__all__ = [
    "METRIC_PREFIX",
    "MetricsServer",
    "SpecroundMetrics",
    "kv_row_bytes",
    "running_servers",
    "serve_metrics",
]

METRIC_PREFIX = "specround:"
"""Prefix of every metric name (vLLM uses ``vllm:``)."""

_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LOG = logging.getLogger("specround.telemetry")
_CONFLICTS = {"StaleGenerationError": "stale_generation", "DuplicateRoundError": "duplicate_round"}
_REFUSALS = {"StaleCoordinateError": "stale_coordinate", "RequestFinishedError": "finished"}


def kv_row_bytes(target: Any) -> int | None:
    """Bytes of one committed K/V row of a target: ``2 * layers * kv_heads * head_dim * 4`` (float32).

    Uses ``target.kv_row_bytes`` when the target declares it, else the compact Llama's configuration
    (``target.model.config``, ``target.num_layers``; its K/V store holds float32); None when unknown.
    """
    declared = getattr(target, "kv_row_bytes", None)
    if isinstance(declared, int):
        return declared
    config = getattr(getattr(target, "model", None), "config", None)
    if config is None:
        return None
    layers = int(getattr(target, "num_layers", config.num_layers))
    return 2 * layers * int(config.num_kv_heads) * int(config.head_dim) * 4


class SpecroundMetrics:
    """A :class:`~specround.telemetry.observation.RoundRecorder` counting rounds into Prometheus metrics."""

    def __init__(
        self,
        *,
        model_name: str = "unknown",
        kv_row_bytes: int | None = None,
        registry: CollectorRegistry | None = None,
        log_rounds: bool = True,
    ) -> None:
        """Register every metric in ``registry`` (default: a fresh one, see :attr:`registry`).

        ``kv_row_bytes`` turns K/V row counts into bytes (:func:`kv_row_bytes`); the byte counters stay at
        zero without it. ``log_rounds`` also logs each round on the ``specround.telemetry`` logger (DEBUG
        for published rounds, WARNING for aborted ones) with its request and round ids.
        """
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.kv_row_bytes = kv_row_bytes
        self.log_rounds = log_rounds
        p, r, m = METRIC_PREFIX, self.registry, ("model_name",)
        self.num_drafts = Counter(
            f"{p}spec_decode_num_drafts", "Published rounds that drafted.", m, registry=r
        )
        self.num_draft_tokens = Counter(
            f"{p}spec_decode_num_draft_tokens", "Draft tokens proposed.", m, registry=r
        )
        self.num_accepted_tokens = Counter(
            f"{p}spec_decode_num_accepted_tokens", "Draft tokens accepted.", m, registry=r
        )
        self.num_accepted_tokens_per_pos = Counter(
            f"{p}spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by 0-based draft position.",
            (*m, "position"),
            registry=r,
        )
        self.rounds_published = Counter(
            f"{p}rounds_published", "Rounds published, by terminal kind.", (*m, "terminal"), registry=r
        )
        self.rounds_acknowledged = Counter(
            f"{p}rounds_acknowledged", "Retried rounds acknowledged idempotently.", m, registry=r
        )
        self.rounds_unacknowledged = Counter(
            f"{p}rounds_unacknowledged",
            "Rounds published whose acknowledgement was lost (F-6).",
            (*m, "fault_point"),
            registry=r,
        )
        self.rounds_aborted = Counter(
            f"{p}rounds_aborted",
            "Rounds aborted before publication, by error and fault point.",
            (*m, "reason", "fault_point"),
            registry=r,
        )
        self.publish_conflicts = Counter(
            f"{p}publish_conflicts", "Publications that lost the generation fence.", (*m, "kind"), registry=r
        )
        self.fence_refusals = Counter(
            f"{p}fence_refusals", "Rounds refused before publishing.", (*m, "reason"), registry=r
        )
        self.phase_seconds = {
            phase: Histogram(
                f"{p}round_{phase}_seconds",
                f"Wall seconds of the {phase} part of a round (contract#time-ledger).",
                m,
                buckets=_SECONDS_BUCKETS,
                registry=r,
            )
            for phase in ("draft", "verify", "state", "queue")
        }
        self.kv_rows = {
            kind: Counter(f"{p}kv_{kind}_rows", f"{kind.capitalize()} K/V rows.", m, registry=r)
            for kind in ("temporary", "committed")
        }
        self.kv_bytes = {
            kind: Counter(f"{p}kv_{kind}_bytes", f"{kind.capitalize()} K/V bytes.", m, registry=r)
            for kind in ("temporary", "committed")
        }
        self.generation_tokens = Counter(f"{p}generation_tokens", "Output tokens published.", m, registry=r)
        self.output_tokens = Counter(
            f"{p}output_tokens", "Output tokens by speculation on/off.", (*m, "speculation"), registry=r
        )
        self.round_seconds = Counter(
            f"{p}round_seconds", "Summed T_round by speculation on/off.", (*m, "speculation"), registry=r
        )
        self.tpot = Histogram(
            f"{p}time_per_output_token_seconds",
            "Each output token's share T_round / G of its round, by speculation on/off.",
            (*m, "speculation"),
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )

    def observe_round(self, observation: RoundObservation) -> None:
        """Count one round (see the module docstring for what goes where)."""
        obs, model = observation, self.model_name
        if obs.status in ("published", "acknowledged"):
            if obs.status == "acknowledged":
                self.rounds_acknowledged.labels(model).inc()
                self._log(logging.DEBUG, "round acknowledged", obs)
                return  # counted when it was published
            self._published(obs)
            return
        reason = obs.error or "unknown"
        if obs.status == "unacknowledged":
            self.rounds_unacknowledged.labels(model, obs.fault_point or "none").inc()
            self._log(logging.WARNING, "round published, acknowledgement lost", obs)
            return
        self.rounds_aborted.labels(model, reason, obs.fault_point or "none").inc()
        if reason in _CONFLICTS:
            self.publish_conflicts.labels(model, _CONFLICTS[reason]).inc()
        if reason in _REFUSALS:
            self.fence_refusals.labels(model, _REFUSALS[reason]).inc()
        self.kv_rows["temporary"].labels(model).inc(obs.verify_rows)
        if self.kv_row_bytes is not None:
            self.kv_bytes["temporary"].labels(model).inc(obs.verify_rows * self.kv_row_bytes)
        self._log(logging.WARNING, "round aborted", obs)

    def _published(self, obs: RoundObservation) -> None:
        model = self.model_name
        self.rounds_published.labels(model, obs.terminal or "unknown").inc()
        if obs.drafted > 0:
            self.num_drafts.labels(model).inc()
            self.num_draft_tokens.labels(model).inc(obs.drafted)
            self.num_accepted_tokens.labels(model).inc(obs.accepted)
            for position in range(obs.accepted):
                self.num_accepted_tokens_per_pos.labels(model, str(position)).inc()
        self.kv_rows["temporary"].labels(model).inc(obs.verify_rows)
        self.kv_rows["committed"].labels(model).inc(obs.committed_rows)
        if self.kv_row_bytes is not None:
            self.kv_bytes["temporary"].labels(model).inc(obs.verify_rows * self.kv_row_bytes)
            self.kv_bytes["committed"].labels(model).inc(obs.committed_rows * self.kv_row_bytes)
        self.generation_tokens.labels(model).inc(obs.emitted)
        speculation = "on" if obs.drafted > 0 else "off"
        self.output_tokens.labels(model, speculation).inc(obs.emitted)
        timings = obs.timings
        if timings is not None:
            for phase, seconds in (
                ("draft", timings.draft_s),
                ("verify", timings.verify_s),
                ("state", timings.state_s),
                ("queue", timings.queue_s),
            ):
                self.phase_seconds[phase].labels(model).observe(seconds)
            total = timings.draft_s + timings.verify_s + timings.state_s + timings.queue_s
            self.round_seconds.labels(model, speculation).inc(total)
            if obs.emitted:
                share = total / obs.emitted
                histogram = self.tpot.labels(model, speculation)
                for _ in range(obs.emitted):
                    histogram.observe(share)
        self._log(logging.DEBUG, "round published", obs)

    def _log(self, level: int, message: str, obs: RoundObservation) -> None:
        if not self.log_rounds or not _LOG.isEnabledFor(level):
            return
        _LOG.log(
            level,
            message,
            extra={
                "request_id": obs.request_id,
                "round_id": obs.round_id,
                "generation": obs.generation,
                "status": obs.status,
                "drafted": obs.drafted,
                "accepted": obs.accepted,
                "emitted": obs.emitted,
                "terminal": obs.terminal,
                "error": obs.error,
                "fault_point": obs.fault_point,
            },
        )


@dataclass(slots=True, eq=False)
class MetricsServer:
    """A running HTTP exposition endpoint (``GET /metrics``); :meth:`close` stops it."""

    host: str
    port: int
    _server: Any
    _thread: Any

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and join the server thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if self in _RUNNING:
            _RUNNING.remove(self)


_RUNNING: list[MetricsServer] = []


def running_servers() -> list[MetricsServer]:
    """The endpoints this process started and has not closed (the CLI's lives until the process ends)."""
    return list(_RUNNING)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` on ``host:port`` in a daemon thread (loopback by default; port 0: a free port)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    running = MetricsServer(host=host, port=int(server.server_port), _server=server, _thread=thread)
    _RUNNING.append(running)
    return running
