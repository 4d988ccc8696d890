"""The z3 round relation against hand-computed rounds (contract#kv-commit traces), and its input validation.

Each case builds a concrete before-state, round inputs and the after-state worked out by hand from the
specification, checks that the relation accepts it, and checks that the relation rejects the after-states
of the classic mistakes (a committed rejected row, an extra RNG draw, output after a stop, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import z3

from specround.errors import InputError
from specround.model_check.z3.hash_chain import ChainModel
from specround.model_check.z3.proof_runner import ProofStatus, run_proof
from specround.model_check.z3.proofs import Obligation, Proof, ProofKind
from specround.model_check.z3.protocol_state import (
    NO_TXN,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
    fault_code,
)
from specround.model_check.z3.transition import conforms, expected_post, state_values
from specround.sampling.types import Layout
from specround.statemachine.state import RequestConfig, RequestState, RngCounters

LAYOUTS = [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER]
EOS = 2
PROMPT = (10, 11, 12)
K = 4


@dataclass(frozen=True)
class S:
    """Plain values of a model state (tuples of ints, counters as (proposal, accept, terminal))."""

    output: tuple[int, ...] = PROMPT
    processed: tuple[int, ...] = ()
    rng: tuple[int, int, int] = (0, 0, 0)
    generation: int = 0
    finished: bool = False
    last_txn: int = NO_TXN
    cache: tuple[int, ...] | None = None
    frontier: int | None = None
    position: int | None = None
    log_rounds: int | None = None

    def z3(self) -> ProtocolState:
        cache = self.output[:-1] if self.cache is None else self.cache
        return ProtocolState.concrete(
            output=self.output,
            cache=cache,
            frontier=self.output[-1] if self.frontier is None else self.frontier,
            position=len(cache) if self.position is None else self.position,
            processed=self.processed,
            rng=self.rng,
            generation=self.generation,
            finished=self.finished,
            log_rounds=self.log_rounds,
            last_txn=self.last_txn,
        )


def config(layout: Layout, max_new: int = 16) -> ProtocolConfig:
    return ProtocolConfig.concrete(
        max_draft=K, layout=layout, prompt_len=len(PROMPT), max_new=max_new, stop_ids=(EOS,)
    )


def round_inputs(
    pre: S,
    drafts: tuple[int, ...],
    accepted: int,
    terminal: int,
    *,
    fault: str | None = None,
    expected: int | None = None,
    txn: int = 7,
    rows: tuple[int, ...] | None = None,
) -> RoundInputs:
    """Honest branch rows [F, d_1..d_k] at P unless ``rows`` overrides them."""
    frontier = pre.output[-1]
    return RoundInputs.concrete(
        max_draft=K,
        drafts=drafts,
        accepted=accepted,
        terminal_token=terminal,
        row_tokens=(frontier, *drafts) if rows is None else rows,
        row_base=len(pre.output) - 1,
        expected_generation=pre.generation if expected is None else expected,
        txn=txn,
        proposal_draws=len(drafts),
        fault=fault,
    )


def check(layout: Layout, pre: S, inputs: RoundInputs, post: S, max_new: int = 16) -> bool:
    return conforms(pre.z3(), inputs, post.z3(), config(layout, max_new))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_acceptance_commits_frontier_and_accepted_rows_only(layout: Layout) -> None:
    # contract#kv-commit toy trace: K = 4, A = 2, d_3 rejected, correction 30. INV-1, INV-3, INV-4, INV-5.
    pre = S()
    inputs = round_inputs(pre, (20, 21, 22, 23), accepted=2, terminal=30)
    good = S(
        output=(*PROMPT, 20, 21, 30),
        processed=(20, 21, 30),
        rng=(4, 3, 1),
        generation=1,
        last_txn=7,
    )
    assert check(layout, pre, inputs, good)
    assert expected_post(pre.z3(), inputs, config(layout)) == state_values(good.z3())
    assert expected_post(pre.z3(), inputs, config(layout))["cache"] == (*PROMPT, 20, 21)
    # committed the rejected draft row 22 as if it were the correction's row (INV-5)
    assert not check(layout, pre, inputs, replace(good, cache=(*PROMPT, 20, 21, 22)))
    # skipped the frontier row (INV-5, INV-1)
    assert not check(layout, pre, inputs, replace(good, cache=(10, 11, 20, 21), position=4))
    # counted the unreached tests at d_4 (INV-3)
    assert not check(layout, pre, inputs, replace(good, rng=(4, 4, 1)))
    # advanced the processors over the rejected draft (INV-4)
    assert not check(layout, pre, inputs, replace(good, processed=(20, 21, 22, 30)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_acceptance_still_commits_the_frontier_row(layout: Layout) -> None:
    pre = S()
    inputs = round_inputs(pre, (20, 21), accepted=0, terminal=40)
    post = S(output=(*PROMPT, 40), processed=(40,), rng=(2, 1, 1), generation=1, last_txn=7)
    assert check(layout, pre, inputs, post)
    assert not check(layout, pre, inputs, replace(post, cache=(10, 11), position=2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_full_acceptance_emits_the_bonus(layout: Layout) -> None:
    # contract#kv-commit "full acceptance, no stop": growth 4, three accepted rows (+ the frontier row), bonus
    # pending.
    pre = S()
    inputs = round_inputs(pre, (20, 21, 22), accepted=3, terminal=50)
    post = S(
        output=(*PROMPT, 20, 21, 22, 50), processed=(20, 21, 22, 50), rng=(3, 3, 1), generation=1, last_txn=7
    )
    assert check(layout, pre, inputs, post)
    # the bonus token must not own a committed row
    assert not check(layout, pre, inputs, replace(post, cache=(*PROMPT, 20, 21, 22, 50)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eos_inside_the_accepted_prefix_truncates_without_a_terminal_draw(layout: Layout) -> None:
    # contract#kv-commit "EOS at d_2": output append [d_1, EOS]; two reached tests, no terminal draw;
    # finished.
    pre = S()
    inputs = round_inputs(pre, (20, EOS, 22), accepted=3, terminal=50)
    post = S(
        output=(*PROMPT, 20, EOS), processed=(20, EOS), rng=(3, 2, 0), generation=1, finished=True, last_txn=7
    )
    assert check(layout, pre, inputs, post)
    # continued after the stop (INV-2)
    assert not check(
        layout,
        pre,
        inputs,
        replace(post, output=(*PROMPT, 20, EOS, 22, 50), processed=(20, EOS, 22, 50), rng=(3, 3, 1)),
    )
    # drew a terminal uniform anyway (INV-3)
    assert not check(layout, pre, inputs, replace(post, rng=(3, 2, 1)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_length_cap_inside_the_prefix(layout: Layout) -> None:
    # contract#kv-commit "length cap after d_3": budget 3, A = 3 = k; append [d_1, d_2, d_3], no terminal
    # draw.
    pre = S()
    inputs = round_inputs(pre, (20, 21, 22), accepted=3, terminal=50)
    post = S(
        output=(*PROMPT, 20, 21, 22),
        processed=(20, 21, 22),
        rng=(3, 3, 0),
        generation=1,
        finished=True,
        last_txn=7,
    )
    assert check(layout, pre, inputs, post, max_new=3)
    assert not check(layout, pre, inputs, post, max_new=4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eos_as_correction_finishes(layout: Layout) -> None:
    pre = S()
    inputs = round_inputs(pre, (20, 21), accepted=1, terminal=EOS)
    post = S(
        output=(*PROMPT, 20, EOS), processed=(20, EOS), rng=(2, 2, 1), generation=1, finished=True, last_txn=7
    )
    assert check(layout, pre, inputs, post)
    assert not check(layout, pre, inputs, replace(post, finished=False))


@pytest.mark.parametrize("point", ["F-1", "F-2", "F-3", "F-4", "F-5"])
def test_faults_before_publication_leave_the_state_unchanged(point: str) -> None:
    # INV-7: F-1..F-5 leave S_0 authoritative and the log untouched.
    pre = S()
    inputs = round_inputs(pre, (20, 21), accepted=1, terminal=30, fault=point)
    successor = S(output=(*PROMPT, 20, 30), processed=(20, 30), rng=(2, 2, 1), generation=1, last_txn=7)
    assert check(Layout.REPLAY_FRONTIER, pre, inputs, pre)
    assert not check(Layout.REPLAY_FRONTIER, pre, inputs, successor)


def test_lost_acknowledgement_then_retry_is_idempotent() -> None:
    # F-6 publishes; the retry of the same transaction returns the same successor and appends nothing (INV-6).
    pre = S()
    successor = S(output=(*PROMPT, 20, 30), processed=(20, 30), rng=(2, 2, 1), generation=1, last_txn=7)
    assert check(Layout.REPLAY_FRONTIER, pre, round_inputs(pre, (20, 21), 1, 30, fault="F-6"), successor)
    retry = round_inputs(pre, (20, 21), 1, 30, expected=0, txn=7)
    assert check(Layout.REPLAY_FRONTIER, successor, retry, successor)
    appended_twice = S(
        output=(*PROMPT, 20, 30, 20, 30), processed=(20, 30, 20, 30), rng=(4, 4, 2), generation=2, last_txn=7
    )
    assert not check(Layout.REPLAY_FRONTIER, successor, retry, appended_twice)


def test_stale_writer_is_refused() -> None:
    # A different transaction prepared at generation 0 cannot publish on top of generation 1 (INV-6).
    winner = S(output=(*PROMPT, 20, 30), processed=(20, 30), rng=(2, 2, 1), generation=1, last_txn=7)
    loser = round_inputs(S(), (25,), 0, 31, expected=0, txn=8)
    assert check(Layout.REPLAY_FRONTIER, winner, loser, winner)
    on_top = S(output=(*PROMPT, 20, 30, 31), processed=(20, 30, 31), rng=(3, 2, 2), generation=2, last_txn=8)
    assert not check(Layout.REPLAY_FRONTIER, winner, loser, on_top)


def test_finished_request_gets_no_round() -> None:
    done = S(output=(*PROMPT, EOS), processed=(EOS,), rng=(0, 0, 1), generation=1, finished=True, last_txn=7)
    inputs = round_inputs(done, (20,), 1, 30, txn=9)
    assert check(Layout.REPLAY_FRONTIER, done, inputs, done)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_misreported_branch_rows_abort_the_round(layout: Layout) -> None:
    # A stale retained/replayed frontier row (token 99 instead of F = 12) fails staging validation
    # (contract#staging).
    pre = S()
    inputs = round_inputs(pre, (20, 21), 1, 30, rows=(99, 20, 21))
    assert check(layout, pre, inputs, pre)
    # a wrong token in a row that is discarded anyway does not matter
    assert check(
        layout,
        pre,
        round_inputs(pre, (20, 21), 1, 30, rows=(12, 20, 77)),
        S(output=(*PROMPT, 20, 30), processed=(20, 30), rng=(2, 2, 1), generation=1, last_txn=7),
    )


def test_ill_formed_inputs_are_refused_without_change() -> None:
    pre = S()
    # A > k
    inputs = RoundInputs.concrete(
        max_draft=K,
        drafts=(20,),
        accepted=2,
        terminal_token=30,
        row_tokens=(12, 20),
        row_base=2,
        expected_generation=0,
        txn=7,
    )
    assert check(Layout.REPLAY_FRONTIER, pre, inputs, pre)


def test_builders_refuse_bad_values() -> None:
    with pytest.raises(InputError):
        fault_code("F-7")
    with pytest.raises(InputError):
        ProtocolConfig.concrete(max_draft=9, layout="replay_frontier", prompt_len=1, max_new=1, stop_ids=())
    with pytest.raises(InputError):
        RoundInputs.concrete(
            max_draft=1,
            drafts=(1, 2),
            accepted=0,
            terminal_token=3,
            row_tokens=(0, 1, 2),
            row_base=0,
            expected_generation=0,
            txn=0,
        )
    assert fault_code(None) == 0 and fault_code("F-6") == 6


def test_request_state_conversion() -> None:
    request = RequestConfig(
        request_id="r",
        prompt_ids=PROMPT,
        seed=1,
        max_new_tokens=16,
        layout=Layout.RETAINED_FRONTIER,
        vocab_size=100,
    )
    before = RequestState(
        request_id="r",
        output=PROMPT,
        prompt_len=3,
        cache=PROMPT[:-1],
        frontier=PROMPT[-1],
        position=2,
        processors=(),
        processors_digest="x",
        rng=RngCounters(),
        generation=0,
    )
    after = before.model_copy(
        update={
            "output": (*PROMPT, 20, 30),
            "cache": (*PROMPT, 20),
            "frontier": 30,
            "position": 4,
            "rng": RngCounters(proposal=2, accept=2, terminal=1),
            "generation": 1,
        }
    )
    cfg = ProtocolConfig.from_request_config(request, max_draft=K, stop_ids=(EOS,))
    inputs = round_inputs(S(), (20, 21), 1, 30)
    pre = ProtocolState.from_request_state(before, processed=())
    post = ProtocolState.from_request_state(after, processed=(20, 30), last_txn=7)
    assert conforms(pre, inputs, post, cfg)
    with pytest.raises(InputError):
        ProtocolState.from_request_state(before.model_copy(update={"frontier": None}), processed=())
    with pytest.raises(InputError):
        state_values(ProtocolState.symbolic("s"))


class NoDepthChain(ChainModel):
    """A hash without the acyclicity axiom: ``H(a, e) == a`` is no longer excluded."""

    def link(self, prev: z3.ExprRef, event: z3.ArithRef) -> z3.ExprRef:
        digest = self.hash(prev, event)
        self.facts += [self.prev_of(digest) == prev, self.event_of(digest) == event]
        return digest


def test_duplicate_detection_needs_acyclic_links() -> None:
    # INV-9: with acyclic links a duplicated event breaks the chain; without that axiom the same query has
    # a counterexample, so the chain proofs are not passing on a technicality.
    def duplicated(model: ChainModel) -> Obligation:
        rows = model.build([z3.Int(f"e{i}") for i in range(3)])
        tampered = [rows[0], rows[0], *rows[1:]]
        goal = z3.Not(z3.And(model.verify(tampered), model.head(tampered) == model.head(rows)))
        return Obligation(premises=tuple(model.facts), goal=goal)

    sound = run_proof(Proof("dup", ("INV-9",), ProofKind.VALID, lambda: duplicated(ChainModel()), ""))
    assert sound.status is ProofStatus.PROVED
    weak = run_proof(
        Proof("dup-weak", ("INV-9",), ProofKind.REFUTABLE, lambda: duplicated(NoDepthChain()), "")
    )
    assert weak.status is ProofStatus.REFUTED
