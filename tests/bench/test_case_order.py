"""Benchmark blocks run their cases alternately forward and backward."""

from __future__ import annotations

from specround.bench.case_order import case_order


def test_blocks_alternate_so_every_case_is_as_often_early_as_late() -> None:
    cases = ["a", "b", "c", "d"]
    orders = [case_order(cases, block) for block in range(4)]
    assert orders[0] == cases and orders[1] == cases[::-1] and orders[2] == cases
    mean_position = {c: sum(order.index(c) for order in orders) / len(orders) for c in cases}
    assert set(mean_position.values()) == {1.5}  # balanced over an even number of blocks
    assert cases == ["a", "b", "c", "d"]  # the input is not reordered in place
