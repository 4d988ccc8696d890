"""Signed heads on every SQL backend: each group commit signs the heads it moved, inside its transaction."""

from __future__ import annotations

import torch

from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log, audit_signatures
from specround.signing import HmacSigner
from specround.statemachine.controller import RoundController
from tests.statemachine.step_fuzz import random_input

KEY = b"a key of at least sixteen bytes"


def test_every_group_commit_signs_the_heads_it_moved(log_url: str) -> None:
    signer = HmacSigner(KEY)
    with SqlEventLog.open(log_url, signer=signer, checkpoint_every=3) as log:
        controller = RoundController(log)
        for rid in ("a", "b"):
            controller.open_request((1, 2), seed=1, vocab_size=16, request_id=rid, max_new_tokens=100)
        generator = torch.Generator().manual_seed(0)
        for _ in range(5):
            controller.step([random_input(controller, rid, 2, generator) for rid in ("a", "b")])
        rows = log.signature_rows()
        assert [r.scope for r in rows].count("head") == 2 + 5 * 2  # opens, then two heads per step
        assert [r.scope for r in rows].count("checkpoint") == 2  # publishing calls 0 and 3
        assert audit_log(log).ok and audit_signatures(log, signer) == []
        assert audit_signatures(log, HmacSigner(b"some other key, 16+ bytes"))
