"""Serving telemetry: the acceptance log as a query, Prometheus metrics, structured logging.

Contract: contract#acceptance-log, contract#serving-telemetry.

* :func:`acceptance_log` reads the acceptance log of a request back from the event log
  (``specround log LOG --request ID``).
* :class:`SpecroundMetrics` records :class:`RoundObservation` values (built by the serving loop from the
  controller's round results) into Prometheus metrics under vLLM's speculative-decoding names with a
  ``specround:`` prefix, plus this project's own; :func:`serve_metrics` exposes them on 127.0.0.1
  (``specround generate --metrics-port N``).
* :func:`configure_logging` sets up stdlib logging with a JSON formatter option; records carry request and
  round ids (:func:`log_context`).

The domain never imports this package: the serving loop hands observations to any :class:`RoundRecorder`.
"""

from specround.telemetry.acceptance import AcceptanceEntry, acceptance_log
from specround.telemetry.logs import JsonFormatter, configure_logging, log_context
from specround.telemetry.metrics import (
    METRIC_PREFIX,
    MetricsServer,
    SpecroundMetrics,
    kv_row_bytes,
    running_servers,
    serve_metrics,
)
from specround.telemetry.observation import RoundObservation, RoundRecorder

__all__ = [
    "METRIC_PREFIX",
    "AcceptanceEntry",
    "JsonFormatter",
    "MetricsServer",
    "RoundObservation",
    "RoundRecorder",
    "SpecroundMetrics",
    "acceptance_log",
    "configure_logging",
    "kv_row_bytes",
    "log_context",
    "running_servers",
    "serve_metrics",
]
