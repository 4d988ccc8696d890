"""Every refusal of the exact sampler, by name, raised before a decision is returned; what "read" and "full"
validation each check; and the normalisation tolerance at its boundary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    InputError,
    InvalidRequestError,
    NegativeMassError,
    NonFiniteProbabilityError,
    NotNormalisedError,
    ShapeMismatchError,
    ZeroProposalProbabilityError,
)
from specround.sampling.exact import decide, decide_from_uniforms
from specround.sampling.types import PAD_ID, SamplerBatch
from specround.sampling.validation import normalisation_tolerance
from tests.sampling.test_exact import make_batch, one_hot

F64 = torch.float64
NAN, INF = float("nan"), float("inf")
VOCAB, K_MAX = 6, 2


def good_batch(dtype: torch.dtype = F64) -> SamplerBatch:
    """Two requests, K = 2, V = 6, uniform rows; request 0 drafted 2 tokens, request 1 drafted 1."""
    p = torch.full((2, K_MAX + 1, VOCAB), 1 / VOCAB, dtype=dtype)
    q = torch.full((2, K_MAX, VOCAB), 1 / VOCAB, dtype=dtype)
    return make_batch(p, q, [[1, 2], [3, PAD_ID]], [2, 1], stop_ids=[[5], [PAD_ID]], remaining=[4, 4])


def with_(batch: SamplerBatch, **changes: object) -> SamplerBatch:
    return dataclasses.replace(batch, **changes)  # type: ignore[arg-type]


def edited(
    name: str, edit: Callable[[torch.Tensor], None], batch: SamplerBatch | None = None
) -> SamplerBatch:
    base = batch if batch is not None else good_batch()
    tensor = getattr(base, name).clone()
    edit(tensor)
    return with_(base, **{name: tensor})


def test_good_batch_is_accepted_in_both_modes() -> None:
    for validate in ("read", "full"):
        decision = decide(good_batch(), validate=validate)  # type: ignore[arg-type]
        assert decision.batch_size == 2


class TestStructure:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"p": torch.full((2, VOCAB), 1 / VOCAB, dtype=F64)}, "p must be"),
            ({"p": torch.full((2, K_MAX, VOCAB), 1 / VOCAB, dtype=F64)}, "disagree"),
            ({"q": torch.full((2, K_MAX, VOCAB + 1), 1 / (VOCAB + 1), dtype=F64)}, "disagree"),
            ({"q": torch.full((3, K_MAX, VOCAB), 1 / VOCAB, dtype=F64)}, "disagree"),
            ({"q": torch.full((2, K_MAX, VOCAB), 1 / VOCAB, dtype=torch.float32)}, "share one dtype"),
            ({"draft_ids": torch.tensor([[1, 2], [3, PAD_ID]], dtype=torch.int32)}, "int64"),
            ({"draft_ids": torch.tensor([[1, 2, 3], [3, PAD_ID, PAD_ID]])}, "shape"),
            ({"draft_lens": torch.tensor([2, 1, 0])}, "shape"),
            ({"stop_ids": torch.tensor([5, PAD_ID])}, "stop_ids"),
            ({"stop_ids": torch.tensor([[[5]], [[5]]])}, "shape"),
            ({"remaining": torch.tensor([4.0, 4.0])}, "int64"),
            ({"seeds": torch.tensor([1])}, "shape"),
        ],
    )
    def test_shape_and_dtype_mismatches(self, changes: dict[str, torch.Tensor], message: str) -> None:
        with pytest.raises(ShapeMismatchError, match=message):
            decide(with_(good_batch(), **changes))

    def test_half_precision_rows_are_refused(self) -> None:
        batch = good_batch()
        with pytest.raises(ShapeMismatchError, match="float32 or float64"):
            decide(with_(batch, p=batch.p.half(), q=batch.q.half()))

    def test_device_mismatch(self) -> None:
        with pytest.raises(ShapeMismatchError, match="is on"):
            decide(with_(good_batch(), seeds=torch.zeros(2, dtype=torch.int64, device="meta")))

    @pytest.mark.parametrize("length", [-1, 3])
    def test_draft_length_outside_zero_to_k(self, length: int) -> None:
        with pytest.raises(ShapeMismatchError, match=r"outside 0\.\.K"):
            decide(edited("draft_lens", lambda t: t.__setitem__(1, length)))

    def test_pad_missing_beyond_the_draft_length(self) -> None:
        with pytest.raises(ShapeMismatchError, match="PAD_ID"):
            decide(edited("draft_ids", lambda t: t.__setitem__((1, 1), 4)))

    @pytest.mark.parametrize("token", [VOCAB, VOCAB + 10, -2, PAD_ID])
    def test_draft_id_out_of_vocab_within_the_draft_length(self, token: int) -> None:
        with pytest.raises(DraftIdOutOfVocabError):
            decide(edited("draft_ids", lambda t: t.__setitem__((0, 1), token)))

    def test_budget_below_one(self) -> None:
        with pytest.raises(InvalidRequestError, match="budget"):
            decide(edited("remaining", lambda t: t.__setitem__(0, 0)))

    @pytest.mark.parametrize("name", ["accept_counters", "terminal_counters"])
    def test_negative_counters(self, name: str) -> None:
        with pytest.raises(InvalidRequestError, match=name):
            decide(edited(name, lambda t: t.__setitem__(1, -1)))

    def test_counter_without_room_for_the_round(self) -> None:
        with pytest.raises(InvalidRequestError, match="accept_counters"):
            decide(edited("accept_counters", lambda t: t.__setitem__(0, 2**63 - 2)))

    def test_stop_id_out_of_vocab(self) -> None:
        with pytest.raises(InvalidRequestError, match="stop id"):
            decide(edited("stop_ids", lambda t: t.__setitem__((0, 0), VOCAB)))

    def test_unknown_validation_mode(self) -> None:
        with pytest.raises(InvalidRequestError, match="validate"):
            decide(good_batch(), validate="none")  # type: ignore[arg-type]

    def test_errors_are_input_errors_and_value_errors(self) -> None:
        with pytest.raises(InputError):
            decide(edited("remaining", lambda t: t.__setitem__(0, 0)))
        with pytest.raises(ValueError):
            decide(edited("remaining", lambda t: t.__setitem__(0, 0)))


class TestValuesTheDecisionReads:
    @pytest.mark.parametrize(
        ("name", "index", "value", "error"),
        [
            ("p", (0, 0, 1), NAN, NonFiniteProbabilityError),  # p_1(d_1) of request 0
            ("q", (0, 1, 2), INF, NonFiniteProbabilityError),  # q_2(d_2) of request 0
            ("p", (1, 0, 3), -0.1, NegativeMassError),
            ("q", (0, 0, 1), 0.0, ZeroProposalProbabilityError),
            ("q", (1, 0, 3), 0.0, ZeroProposalProbabilityError),
        ],
    )
    def test_gathered_draft_probabilities(
        self, name: str, index: tuple[int, int, int], value: float, error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            decide(edited(name, lambda t: t.__setitem__(index, value)))

    def test_zero_q_message_names_the_position(self) -> None:
        with pytest.raises(ZeroProposalProbabilityError, match="request 1, draft position 0"):
            decide(edited("q", lambda t: t.__setitem__((1, 0, 3), 0.0)))

    # Request 1 (k = 1) with u = 0 accepts its draft; its terminal row is the bonus row p[1, 1].
    ALL_ACCEPT = (torch.zeros(2, K_MAX, dtype=F64), torch.full((2,), 0.5, dtype=F64))

    @pytest.mark.parametrize(
        ("value", "error"),
        [(NAN, NonFiniteProbabilityError), (INF, NonFiniteProbabilityError), (-1e-3, NegativeMassError)],
    )
    def test_terminal_row_entries(self, value: float, error: type[Exception]) -> None:
        batch = edited("p", lambda t: t.__setitem__((1, 1, 0), value))
        with pytest.raises(error, match="p row 1 of request 1"):
            decide_from_uniforms(batch, *self.ALL_ACCEPT)

    def test_terminal_row_not_normalised(self) -> None:
        batch = edited("p", lambda t: t.__setitem__((1, 1, 0), 0.5))
        with pytest.raises(NotNormalisedError, match="p row 1 of request 1"):
            decide_from_uniforms(batch, *self.ALL_ACCEPT)

    def test_correction_rows_check_both_p_and_q(self) -> None:
        # With p(d_1) < q(d_1), u = 0.99 rejects request 0's first draft: its terminal rows are p and q row 0.
        base = good_batch()
        p = base.p.clone()
        p[0, 0] = torch.tensor([0.2, 0.1, 0.2, 0.2, 0.2, 0.1], dtype=F64)  # p(d_1 = 1) = 0.1 < 1/6
        uniforms = (torch.full((2, K_MAX), 0.99, dtype=F64), torch.full((2,), 0.5, dtype=F64))
        decision = decide_from_uniforms(with_(base, p=p), *uniforms)
        assert decision.terminal_row.tolist()[0] == 0  # a correction from row 0
        q = base.q.clone()
        q[0, 0, 4] = 0.5  # q row 0 of request 0 no longer sums to one
        with pytest.raises(NotNormalisedError, match="q row 0 of request 0"):
            decide_from_uniforms(with_(base, p=p, q=q), *uniforms)

    def test_rows_never_read_are_not_checked_in_read_mode_but_are_in_full_mode(self) -> None:
        # With u = 0 both requests accept every draft: request 1 reads only p(d_1) of its p row 0 and
        # request 0 only p(d_2) of its p row 1.
        cases = [
            ("p", (1, 0, 0), NAN, NonFiniteProbabilityError),
            ("p", (0, 1, 4), -0.5, NegativeMassError),
            ("q", (0, 0, 5), 0.9, NotNormalisedError),
        ]
        for name, index, value, error in cases:
            batch = edited(name, lambda t, index=index, value=value: t.__setitem__(index, value))
            decision = decide_from_uniforms(batch, *self.ALL_ACCEPT, validate="read")
            assert decision.terminal_row.tolist() == [2, 1]
            with pytest.raises(error):
                decide_from_uniforms(batch, *self.ALL_ACCEPT, validate="full")

    def test_padding_rows_are_never_checked(self) -> None:
        # Request 1 drafted one token: q row 1 and p row 2 are padding, even for validate="full".
        batch = edited("q", lambda t: t.__setitem__((1, 1), NAN))
        batch = edited("p", lambda t: t.__setitem__((1, 2), -1.0), batch)
        decide(batch, validate="full")

    def test_reached_uniforms_must_lie_in_zero_one(self) -> None:
        batch = good_batch()
        accept = torch.tensor([[0.1, NAN], [NAN, NAN]], dtype=F64)
        # Request 0: test 1 accepts (p = q), test 2 is reached and NaN -> refused.
        with pytest.raises(InvalidRequestError, match="ACCEPT uniform"):
            decide_from_uniforms(batch, accept, torch.full((2,), 0.5, dtype=F64))
        # Unreached tests may hold NaN (a logged round stores NaN there).
        stopped = with_(batch, remaining=torch.tensor([1, 1]))
        decision = decide_from_uniforms(
            stopped, torch.tensor([[0.1, NAN], [0.2, NAN]], dtype=F64), torch.full((2,), NAN, dtype=F64)
        )
        assert decision.terminal_draws.tolist() == [0, 0]
        with pytest.raises(InvalidRequestError, match="TERMINAL uniform"):
            decide_from_uniforms(batch, torch.zeros(2, K_MAX, dtype=F64), torch.tensor([0.5, 1.0], dtype=F64))

    def test_uniform_shapes_and_dtypes(self) -> None:
        batch = good_batch()
        with pytest.raises(ShapeMismatchError, match="accept_uniforms"):
            decide_from_uniforms(batch, torch.zeros(2, K_MAX + 1, dtype=F64), torch.zeros(2, dtype=F64))
        with pytest.raises(ShapeMismatchError, match="terminal_uniforms"):
            decide_from_uniforms(batch, torch.zeros(2, K_MAX, dtype=F64), torch.zeros(2, dtype=torch.float32))


class TestNormalisationTolerance:
    def test_stated_values(self) -> None:
        assert normalisation_tolerance(torch.float32, 100) == pytest.approx(1e-4)
        assert normalisation_tolerance(torch.float32, 49_152) == pytest.approx(1e-4 * 49.152)
        assert normalisation_tolerance(torch.float64, 49_152) == pytest.approx(1e-9)
        with pytest.raises(ShapeMismatchError):
            normalisation_tolerance(torch.float16, 10)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_boundary(self, dtype: torch.dtype) -> None:
        tolerance = normalisation_tolerance(dtype, VOCAB)

        def bonus_row_off_by(excess: float) -> SamplerBatch:
            row = torch.full((VOCAB,), 1 / VOCAB, dtype=F64)
            row[0] += excess
            return edited("p", lambda t: t.__setitem__((1, 1), row.to(dtype)), good_batch(dtype))

        uniforms = (torch.zeros(2, K_MAX, dtype=F64), torch.full((2,), 0.5, dtype=F64))
        decide_from_uniforms(bonus_row_off_by(0.5 * tolerance), *uniforms)
        decide_from_uniforms(bonus_row_off_by(-0.5 * tolerance), *uniforms)
        with pytest.raises(NotNormalisedError):
            decide_from_uniforms(bonus_row_off_by(2 * tolerance), *uniforms)
        with pytest.raises(NotNormalisedError):
            decide_from_uniforms(bonus_row_off_by(-2 * tolerance), *uniforms)


def test_refusal_leaves_the_inputs_untouched() -> None:
    batch = edited("p", lambda t: t.__setitem__((1, 1, 0), NAN))
    before = {name: getattr(batch, name).clone() for name in SamplerBatch.__dataclass_fields__}  # type: ignore[attr-defined]
    with pytest.raises(NonFiniteProbabilityError):
        decide_from_uniforms(batch, torch.zeros(2, K_MAX, dtype=F64), torch.full((2,), 0.5, dtype=F64))
    for name, tensor in before.items():
        assert torch.equal(getattr(batch, name).nan_to_num(7.0), tensor.nan_to_num(7.0)), name


def test_one_hot_rows_are_valid() -> None:
    p = torch.stack([one_hot(1, VOCAB), one_hot(2, VOCAB)])[None]
    q = one_hot(1, VOCAB)[None, None]
    decision = decide(make_batch(p, q, [[1]]), validate="full")
    assert decision.output_ids.tolist() == [[1, 2]]
