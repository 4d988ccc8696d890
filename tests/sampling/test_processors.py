"""Each processor kind against a plain reference, its parameter validation, and its spec round trip."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from specround.errors import InvalidProcessorError
from specround.sampling.processors import (
    PROCESSOR_KINDS,
    FrequencyPenalty,
    Greedy,
    LogitBias,
    LogitProcessor,
    MinP,
    PresencePenalty,
    RepetitionPenalty,
    Temperature,
    TokenGrammar,
    TopK,
    TopP,
    build_processor,
    processor_from_spec,
    stateless,
)

NEG_INF = float("-inf")


def kept(row: torch.Tensor) -> set[int]:
    return {int(i) for i in torch.isfinite(row).nonzero().flatten()}


def ranked(values: list[float]) -> list[int]:
    """Token ids by value descending, ties by ascending id."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


_tied_rows = st.integers(1, 40).flatmap(
    lambda v: st.lists(
        st.lists(st.sampled_from([NEG_INF, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=v, max_size=v),
        min_size=1,
        max_size=3,
    )
)


# --- stateless ------------------------------------------------------------------------------------------


def test_temperature_divides_and_validates() -> None:
    x = torch.tensor([[2.0, -1.0, NEG_INF]], dtype=torch.float64)
    assert torch.equal(Temperature(0.5).apply(x), torch.tensor([[4.0, -2.0, NEG_INF]], dtype=torch.float64))
    assert Temperature(2).params() == {"temperature": 2.0}
    for bad in (0, -1.0, math.nan, math.inf, True, "1.0", None):
        with pytest.raises(InvalidProcessorError):
            Temperature(bad)  # type: ignore[arg-type]


def test_greedy_is_an_exact_one_hot_with_lowest_id_on_ties() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [NEG_INF, NEG_INF, 0.0, 0.0], [NEG_INF] * 4])
    out = Greedy().apply(x)
    assert kept(out[0]) == {1}
    assert kept(out[1]) == {2}
    assert kept(out[2]) == set()  # an empty row stays empty (the chain refuses it)
    assert torch.equal(torch.softmax(out[:2], -1), torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_one_hot_marks_the_first_arg_max_in_every_dtype_and_layout(dtype: torch.dtype) -> None:
    """One-hot rows at torch's first arg-max, for numpy's CPU scan and torch's own, strided rows included."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(0, 4, (7, 40), generator=gen).to(dtype)  # many ties per row
    x[3] = NEG_INF
    x[3, 16] = 2.0
    for rows in (x, x.t().contiguous().t(), x[:, ::2]):
        got = Greedy().one_hot(rows)
        assert got is not None and got.dtype == rows.dtype
        expected = torch.zeros_like(rows).scatter_(-1, rows.argmax(dim=-1, keepdim=True), 1.0)
        assert torch.equal(got, expected)
    assert Greedy().one_hot(torch.full((2, 5), NEG_INF, dtype=dtype)) is None  # left to the general path


@given(rows=_tied_rows, k=st.integers(1, 45))
def test_top_k_matches_reference(rows: list[list[float]], k: int) -> None:
    x = torch.tensor(rows, dtype=torch.float64)
    out = TopK(k).apply(x)
    for row, got in zip(rows, out, strict=True):
        expected = {i for i in ranked(row)[:k] if row[i] != NEG_INF}
        assert kept(got) == expected
        assert torch.equal(got[torch.isfinite(got)], torch.tensor(row, dtype=torch.float64)[sorted(expected)])


def reference_nucleus(row: list[float], p: float) -> tuple[set[int], list[float]]:
    m = max(row)
    weights = [math.exp(v - m) if v != NEG_INF else 0.0 for v in row]
    total = sum(weights)
    probs = [w / total for w in weights]
    keep: set[int] = set()
    before = 0.0
    sums = []
    for i in sorted(range(len(row)), key=lambda i: (-probs[i], i)):
        if before < p:
            keep.add(i)
        before += probs[i]
        sums.append(before)
    return keep, sums


@given(rows=_tied_rows, p=st.floats(0.01, 0.999))
def test_top_p_matches_reference(rows: list[list[float]], p: float) -> None:
    for row in rows:
        assume(max(row) != NEG_INF)
        _, sums = reference_nucleus(row, p)
        assume(all(abs(s - p) > 1e-9 for s in sums))  # keep the boundary away from rounding
    out = TopP(p).apply(torch.tensor(rows, dtype=torch.float64))
    for row, got in zip(rows, out, strict=True):
        expected, _ = reference_nucleus(row, p)
        assert kept(got) == expected
        # The smallest set: its mass reaches p, and without its least likely member it would not.
        probs = torch.softmax(torch.tensor(row, dtype=torch.float64), -1)
        members = sorted(expected)
        assert float(probs[members].sum()) >= p - 1e-12
        assert float(probs[members].sum() - probs[members].min()) < p + 1e-12


def test_top_p_one_keeps_everything_and_validates() -> None:
    x = torch.tensor([[0.0, -50.0, NEG_INF]])
    assert torch.equal(TopP(1.0).apply(x), x)
    for bad in (0.0, -0.1, 1.1, math.nan):
        with pytest.raises(InvalidProcessorError):
            TopP(bad)


def test_top_p_candidate_tiers_equal_the_full_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(5)
    # Coarse integer logits make many ties right at the candidate boundaries.
    x = torch.randint(-4, 4, (6, 300), generator=gen).to(torch.float32)
    x[0, :150] = NEG_INF
    for p in (0.05, 0.3, 0.7, 0.95):
        monkeypatch.setattr(stateless, "_NUCLEUS_TIERS", ())
        full = TopP(p).apply(x)
        monkeypatch.setattr(stateless, "_NUCLEUS_TIERS", (3, 40))
        tiered = TopP(p).apply(x)
        assert torch.equal(torch.isfinite(full), torch.isfinite(tiered))


@given(rows=_tied_rows, p=st.floats(0.0, 1.0))
def test_min_p_matches_reference(rows: list[list[float]], p: float) -> None:
    out = MinP(p).apply(torch.tensor(rows, dtype=torch.float64))
    for row, got in zip(rows, out, strict=True):
        m = max(row)
        if p == 0.0 or m == NEG_INF:
            expected = {i for i, v in enumerate(row) if v != NEG_INF}
        else:
            expected = {i for i, v in enumerate(row) if v != NEG_INF and v >= m + math.log(p)}
        assert kept(got) == expected


def test_min_p_one_keeps_only_the_maxima() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.999]])
    assert kept(MinP(1.0).apply(x)[0]) == {1, 2}
    with pytest.raises(InvalidProcessorError):
        MinP(1.5)


def test_logit_bias_adds_to_chosen_tokens() -> None:
    x = torch.zeros(2, 5, dtype=torch.float32)
    bias = LogitBias({3: 2.5, 0: -1.0})
    out = bias.apply(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.tensor([[-1.0, 0, 0, 2.5, 0]] * 2))
    assert torch.equal(x, torch.zeros(2, 5))  # not in place
    assert bias.params() == {"bias": [[0, -1.0], [3, 2.5]]}
    for bad in ({-1: 1.0}, {1: math.inf}, [[1, 2.0], [1, 3.0]], [[1]]):
        with pytest.raises(InvalidProcessorError):
            LogitBias(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidProcessorError):
        bias.validate_vocab(3)


# --- penalties ------------------------------------------------------------------------------------------


def reference_penalty(kind: str, strength: float, row: list[float], history: list[int]) -> list[float]:
    out = list(row)
    for token in set(history):
        count = history.count(token)
        v = row[token]
        if kind == "repetition_penalty":
            out[token] = v / strength if v > 0 else v * strength
        elif kind == "frequency_penalty":
            out[token] = v - strength * count
        else:
            out[token] = v - strength
    return out


@pytest.mark.parametrize(
    ("cls", "strength"), [(RepetitionPenalty, 1.7), (FrequencyPenalty, 0.4), (PresencePenalty, -0.3)]
)
def test_penalties_follow_their_formulas(cls: type[LogitProcessor], strength: float) -> None:
    gen = torch.Generator().manual_seed(7)
    row = (torch.randn(12, generator=gen, dtype=torch.float64) * 2).tolist()
    row[4] = NEG_INF
    history = [3, 3, 5, 4, 3, 11, 0]
    proc = build_processor(cls.kind, penalty=strength)
    for token in history:
        proc.advance(token)
    got = proc.apply(torch.tensor([row, row], dtype=torch.float64))
    expected = torch.tensor(reference_penalty(cls.kind, strength, row, history), dtype=torch.float64)
    assert torch.equal(got[0], expected)
    assert torch.equal(got[1], expected)


def test_penalty_state_clone_and_round_trip() -> None:
    proc = FrequencyPenalty(0.5)
    for token in (9, 2, 9):
        proc.advance(token)
    assert proc.state() == {"counts": [[2, 1], [9, 2]]}
    twin = proc.clone()
    twin.advance(2)
    assert proc.state() == {"counts": [[2, 1], [9, 2]]}
    assert twin.state() == {"counts": [[2, 2], [9, 2]]}
    spec = json.loads(json.dumps({"kind": proc.kind, "params": proc.params(), "state": proc.state()}))
    rebuilt = processor_from_spec(spec)
    assert rebuilt.state() == proc.state() and rebuilt.params() == proc.params()
    for bad_state in ({"counts": [[2, 0]]}, {"counts": [[2, 1], [2, 1]]}, {"counts": [[-1, 1]]}, {"x": []}):
        with pytest.raises(InvalidProcessorError):
            FrequencyPenalty.from_spec({"penalty": 0.5}, bad_state)
    with pytest.raises(InvalidProcessorError):
        RepetitionPenalty(0.0)


# --- grammar --------------------------------------------------------------------------------------------


def small_grammar() -> TokenGrammar:
    # 0 --1--> 1 --2--> 0, and 0 --3--> 2 (state 2 allows only 0, back to 0)
    return TokenGrammar(3, 0, {0: {1: 1, 3: 2}, 1: {2: 0}, 2: {0: 0}})


def test_grammar_masks_and_advances() -> None:
    g = small_grammar()
    x = torch.zeros(1, 5)
    assert kept(g.apply(x)[0]) == {1, 3}
    g.advance(3)
    assert g.state() == {"state": 2}
    assert kept(g.apply(x)[0]) == {0}
    with pytest.raises(InvalidProcessorError):
        g.advance(1)
    assert g.state() == {"state": 2}  # a refused token changed nothing
    g.advance(0)
    assert g.params()["transitions"] == [[0, 1, 1], [0, 3, 2], [1, 2, 0], [2, 0, 0]]
    rebuilt = processor_from_spec(
        json.loads(json.dumps({"kind": "grammar", "params": g.params(), "state": {}}))
    )
    assert rebuilt.state() == {"state": 0}


@pytest.mark.parametrize(
    "bad",
    [
        {"num_states": 0, "start": 0, "transitions": []},
        {"num_states": 2, "start": 2, "transitions": []},
        {"num_states": 2, "start": 0, "transitions": [[0, 1, 5]]},
        {"num_states": 2, "start": 0, "transitions": [[0, 1, 1], [0, 1, 0]]},
        {"num_states": 2, "start": 0, "transitions": [[0, -1, 1]]},
        {"num_states": 2, "start": 0, "transitions": [[0, 1]]},
    ],
)
def test_grammar_validation(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidProcessorError):
        build_processor("grammar", **bad)


# --- registry -------------------------------------------------------------------------------------------


def test_registry_covers_every_kind_and_refuses_unknown_ones() -> None:
    assert set(PROCESSOR_KINDS) == {
        "temperature",
        "greedy",
        "top_k",
        "top_p",
        "min_p",
        "logit_bias",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "stop_sequences",
        "grammar",
        "no_repeat_ngram",
        "banned_sequences",
        "suppress_tokens",
        "min_length",
        "stop_strings",
    }
    assert all(cls.kind == kind for kind, cls in PROCESSOR_KINDS.items())
    with pytest.raises(InvalidProcessorError):
        build_processor("beam_search")
    with pytest.raises(InvalidProcessorError):
        build_processor("top_k", k=3, extra=1)
    with pytest.raises(InvalidProcessorError):
        build_processor("top_k")
    with pytest.raises(InvalidProcessorError):
        processor_from_spec({"kind": "top_k", "params": {"k": 2}, "state": {"seen": 1}})
    with pytest.raises(InvalidProcessorError):
        processor_from_spec({"kind": "top_k", "params": {"k": 2}, "colour": "red"})


@pytest.mark.parametrize("cls", [Temperature, TopK, TopP, MinP, LogitBias, Greedy])
def test_stateless_processors_do_not_modify_their_input(cls: type[LogitProcessor]) -> None:
    params: dict[str, Any] = {
        "temperature": {"temperature": 0.5},
        "top_k": {"k": 2},
        "top_p": {"p": 0.5},
        "min_p": {"p": 0.5},
        "logit_bias": {"bias": [[1, 1.0]]},
        "greedy": {},
    }[cls.kind]
    proc = build_processor(cls.kind, **params)
    x = torch.tensor([[0.5, 2.0, -1.0, 1.0]])
    before = x.clone()
    proc.apply(x)
    assert torch.equal(x, before)
