"""Auditing event logs: hash chains, replay against the heads, re-derived decisions, and the fault matrix.

Reads logs through the :class:`~specround.statemachine.ports.EventLog` port and uses ``sampling`` and
``statemachine``; the ``audit``, ``replay`` and ``faults`` commands of the CLI are thin wrappers.
"""

from specround.audit.attest import anchor_of, audit_anchor, audit_signatures
from specround.audit.audit_report import AuditFinding, AuditReport, RequestAudit
from specround.audit.fault_matrix import (
    FAULT_MATRIX_SHAPES,
    FaultCell,
    FaultMatrixReport,
    RoundShape,
    run_fault_matrix,
    scripted_round,
)
from specround.audit.run import ReplayCheck, audit_log, audit_request, replay_against_heads, with_findings

__all__ = [
    "FAULT_MATRIX_SHAPES",
    "AuditFinding",
    "AuditReport",
    "FaultCell",
    "FaultMatrixReport",
    "ReplayCheck",
    "RequestAudit",
    "RoundShape",
    "anchor_of",
    "audit_anchor",
    "audit_log",
    "audit_request",
    "audit_signatures",
    "replay_against_heads",
    "run_fault_matrix",
    "scripted_round",
    "with_findings",
]
