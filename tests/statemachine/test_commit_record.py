"""The commit record's recipe: its fields are the record's, and the events rebuild its digest."""

from __future__ import annotations

from typing import Any

from specround.sampling.types import Layout
from specround.statemachine.commit_record import commit_digest_of_events, commit_values
from specround.statemachine.records import assemble, record_digest_of
from specround.statemachine.state import SpeculativeCommit


def _values(layout: Layout) -> dict[str, Any]:
    return commit_values(
        request_id="req",
        round_id="r-3",
        expected_generation=2,
        layout=layout,
        accepted=1,
        terminal="correction",
        emitted=(4, 9),
        committed_kv=(7, 4),
        discarded_kv=(5,),
        rng_before=(3, 6, 2),
        rng_after=(3, 8, 3),
        processor_before="a" * 64,
        processor_after="b" * 64,
        finished=False,
        finish_reason=None,
        coordinate_digest="c" * 64,
        successor_digest="d" * 64,
    )


def _events(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The three events' fields that carry the values (as the log's reader rebuilds them)."""
    ready = {
        "request_id": values["request_id"],
        "round_id": values["round_id"],
        "expected_generation": values["expected_generation"],
        "coordinate_digest": values["coordinate_digest"],
    }
    decided = {
        "accepted": values["accepted_draft_count"],
        "terminal": values["terminal_kind"],
        "emitted_ids": list(values["emitted_token_ids"]),
        "finished": values["finished"],
        "finish_reason": values["finish_reason"],
    }
    staged = {
        "committed_kv_ids": list(values["committed_kv_token_ids"]),
        "discarded_kv_ids": list(values["discarded_kv_token_ids"]),
        "rng_before": list(values["rng_before"]),
        "rng_after": list(values["rng_after"]),
        "processor_before": values["processor_before_hash"],
        "processor_after": values["processor_after_hash"],
        "successor_digest": values["successor_digest"],
    }
    return ready, decided, staged


def test_the_recipe_names_every_field_of_the_record_and_hashes_like_it() -> None:
    values = _values(Layout.REPLAY_FRONTIER)
    assert set(values) == set(SpeculativeCommit.model_fields)
    assert record_digest_of(SpeculativeCommit, values) == assemble(SpeculativeCommit, values).digest()


def test_the_events_rebuild_the_digest_under_the_layout_its_prefix_picks() -> None:
    digests = {layout: record_digest_of(SpeculativeCommit, _values(layout)) for layout in Layout}
    assert len(set(digests.values())) == len(Layout)  # the layout is bound into the digest
    for _ in range(2):  # in either order of the layouts tried first
        for layout, digest in digests.items():
            events = _events(_values(layout))
            assert commit_digest_of_events(*events, digest[:16]) == digest
            assert commit_digest_of_events(*events, digest) == digest
    wrong = format(int(digests[Layout.REPLAY_FRONTIER][:16], 16) ^ 1, "016x")
    assert not any(digest.startswith(wrong) for digest in digests.values())
    assert commit_digest_of_events(*_events(_values(Layout.REPLAY_FRONTIER)), wrong) is None
