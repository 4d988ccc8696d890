"""The step-isolation fuzz on the SQL logs (SQLite, and PostgreSQL when configured), and a reused round id
inside one group commit: the other rounds still publish."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log
from specround.errors import DuplicateRoundError
from specround.statemachine.controller import RoundController
from specround.statemachine.rounds import RoundStatus
from tests.statemachine.step_fuzz import random_input
from tests.statemachine.test_step_fuzz import DEV, assert_fuzz_clean

STEPS = int(os.environ.get("SPECROUND_STEP_FUZZ_SQL_STEPS", "3000" if DEV else "250"))


def test_malformed_rounds_never_harm_another_request_on_sql(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        assert_fuzz_clean(log, STEPS, seed=13)


def test_a_reused_round_id_aborts_only_its_round_of_the_group_commit(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        controller = RoundController(log)
        for rid in ("a", "b", "c"):
            controller.open_request((1, 2, 3), seed=4, vocab_size=16, request_id=rid, max_new_tokens=500)
        generator = torch.Generator().manual_seed(4)
        first = replace(random_input(controller, "a", 2, generator), round_id="same")
        assert controller.step([first])[0].status is RoundStatus.PUBLISHED
        batch = [
            random_input(controller, "b", 2, generator),
            replace(random_input(controller, "a", 1, generator), round_id="same"),
            replace(random_input(controller, "c", 1, generator), round_id="same"),  # another request's id
        ]
        b, a, c = controller.step(batch)
        assert isinstance(a.error, DuplicateRoundError)
        assert b.status is RoundStatus.PUBLISHED and c.status is RoundStatus.PUBLISHED
        assert audit_log(log).ok
