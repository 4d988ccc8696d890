"""The processor chain: rows per logical prefix (contract#processed-rows), state over published tokens
(contract#reached-events), canonical digests, specs, and refusals."""

from __future__ import annotations

import json
import random

import pytest
import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    InvalidProcessorError,
    NonFiniteProbabilityError,
    ShapeMismatchError,
)
from specround.sampling.processors import (
    FrequencyPenalty,
    Greedy,
    LogitBias,
    LogitProcessor,
    MinP,
    PresencePenalty,
    ProcessorChain,
    RepetitionPenalty,
    StopSequences,
    Temperature,
    TokenGrammar,
    TopK,
    TopP,
    sampling_chain,
)
from specround.sampling.softmax import SoftmaxBackend, softmax

V = 12
NEG_INF = float("-inf")


def cyclic_grammar() -> TokenGrammar:
    """State s allows tokens s, s+1, ..., s+5 (mod V) and moves to the token's residue mod 3."""
    return TokenGrammar(3, 0, {s: {(s + j) % V: (s + j) % 3 for j in range(6)} for s in range(3)})


def random_chain(rng: random.Random, softmax: SoftmaxBackend) -> ProcessorChain:
    pool: list[LogitProcessor] = [
        Temperature(rng.uniform(0.3, 2.0)),
        TopK(rng.randint(2, V)),
        TopP(rng.uniform(0.5, 1.0)),
        MinP(rng.uniform(0.0, 0.2)),
        LogitBias({rng.randrange(V): rng.uniform(-2, 2)}),
        RepetitionPenalty(rng.uniform(1.0, 2.0)),
        FrequencyPenalty(rng.uniform(-0.5, 1.0)),
        PresencePenalty(rng.uniform(-0.5, 1.0)),
        StopSequences([[rng.randrange(V)], [rng.randrange(V), rng.randrange(V)]]),
        cyclic_grammar(),
    ]
    rng.shuffle(pool)
    chosen = pool[: rng.randint(1, len(pool))]
    # A grammar after a truncation could mask every survivor; declared policies put it first.
    chosen.sort(key=lambda p: p.kind != "grammar")
    return ProcessorChain(chosen, vocab_size=V, softmax=softmax)


def admissible_path(chain: ProcessorChain, rng: random.Random, length: int) -> list[int]:
    walker = chain.clone()
    path = []
    for _ in range(length):
        options = [t for t in range(V) if all(_allows(p, t) for p in walker.processors)]
        token = rng.choice(options)
        walker.advance(token)
        path.append(token)
    return path


def _allows(p: LogitProcessor, token: int) -> bool:
    try:
        p.validate_token(token)
    except InvalidProcessorError:
        return False
    return True


@pytest.mark.parametrize("softmax", list(SoftmaxBackend))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_along_equals_processing_each_row_at_its_own_prefix(
    softmax: SoftmaxBackend, dtype: torch.dtype
) -> None:
    """contract#processed-rows: each p_i is computed at its own logical history, not over a K x V matrix."""
    rng = random.Random(11)
    for trial in range(25):
        chain = random_chain(rng, softmax)
        chain.advance_many(admissible_path(chain, rng, rng.randint(0, 4)))
        n = rng.randint(1, 6)
        path = admissible_path(chain, rng, n - 1 + rng.randint(0, 2))
        gen = torch.Generator().manual_seed(trial)
        logits = (torch.randn(n, V, generator=gen, dtype=torch.float64) * 2).to(dtype)
        before = chain.digest()
        rows = chain.rows_along(logits, path)
        assert chain.digest() == before  # self is not modified
        assert rows.dtype == dtype and rows.shape == (n, V)
        walker = chain.clone()
        for i in range(n):
            assert torch.equal(rows[i], walker.distribution(logits[i])), (trial, i, chain)
            if i < n - 1:
                walker.advance(path[i])


def test_one_matrix_at_the_start_state_would_be_wrong() -> None:
    """Negative control: with a stateful penalty, the start-state rows differ from per-prefix rows."""
    chain = ProcessorChain([RepetitionPenalty(3.0)], vocab_size=V)
    logits = torch.ones(3, V, dtype=torch.float64)
    rows = chain.rows_along(logits, [4, 7])
    flat = chain.distribution(logits)
    assert torch.equal(rows[0], flat[0])
    assert not torch.equal(rows[1], flat[1]) and not torch.equal(rows[2], flat[2])
    assert float(rows[2, 4]) < float(rows[2, 0]) and float(rows[2, 7]) < float(rows[2, 0])
    assert float(rows[1, 7]) == float(rows[1, 0])  # row 1 has seen only token 4


def test_grammar_path_leaving_the_grammar_holds_the_last_state() -> None:
    chain = ProcessorChain([TokenGrammar(2, 0, {0: {1: 1, 2: 1}, 1: {3: 0}})], vocab_size=V)
    logits = torch.zeros(3, V, dtype=torch.float64)
    rows = chain.rows_along(logits, [5, 6])  # 5 is not allowed at the start state
    assert float(rows[0, 5]) == 0.0  # the refused token has probability 0 in its own row
    assert torch.equal(rows[1], rows[0]) and torch.equal(rows[2], rows[0])
    with pytest.raises(InvalidProcessorError):
        chain.advance(5)


def test_advance_is_all_or_nothing() -> None:
    chain = ProcessorChain([FrequencyPenalty(1.0), TokenGrammar(2, 0, {0: {1: 1}, 1: {2: 0}})], vocab_size=V)
    before = chain.digest()
    with pytest.raises(InvalidProcessorError):
        chain.advance(2)  # the grammar refuses; the penalty before it must not have counted the token
    assert chain.digest() == before
    with pytest.raises(InvalidProcessorError):
        chain.advance_many([1, 2, 2])
    assert chain.digest() == before
    with pytest.raises(DraftIdOutOfVocabError):
        chain.advance(V)
    chain.advance_many([1, 2, 1])
    assert chain.to_spec()[0]["state"] == {"counts": [[1, 2], [2, 1]]}
    assert chain.to_spec()[1]["state"] == {"state": 1}


def test_digests_cover_order_params_state_vocab_and_backend() -> None:
    base = [Temperature(0.7), TopK(5), RepetitionPenalty(1.2)]
    chain = ProcessorChain(base, vocab_size=V)
    variants = [
        ProcessorChain([base[1], base[0], base[2]], vocab_size=V),
        ProcessorChain([Temperature(0.8), base[1], base[2]], vocab_size=V),
        ProcessorChain(base, vocab_size=V + 1),
        ProcessorChain(base, vocab_size=V, softmax="online"),
        ProcessorChain(base[:2], vocab_size=V),
    ]
    digests = {chain.digest()} | {v.digest() for v in variants}
    configs = {chain.config_digest()} | {v.config_digest() for v in variants}
    assert len(digests) == len(configs) == 1 + len(variants)
    advanced = chain.clone()
    advanced.advance(3)
    assert advanced.digest() != chain.digest()
    assert advanced.config_digest() == chain.config_digest()
    # The chain owns copies: advancing the caller's processor object changes nothing inside it.
    base[2].advance(4)
    assert (
        chain.digest()
        == ProcessorChain([Temperature(0.7), TopK(5), RepetitionPenalty(1.2)], vocab_size=V).digest()
    )


def test_spec_round_trips_through_json_with_state() -> None:
    chain = sampling_chain(
        V,
        temperature=0.9,
        top_k=6,
        top_p=0.8,
        min_p=0.01,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.3,
        logit_bias={2: 1.0},
        stop_sequences=[[3, 4], [9]],
        grammar=cyclic_grammar(),
        softmax="online",
    )
    chain.advance_many([1, 3, 4])
    spec = json.loads(json.dumps(chain.to_spec()))
    rebuilt = ProcessorChain.from_spec(spec, vocab_size=V, softmax="online")
    assert rebuilt.digest() == chain.digest()
    logits = torch.randn(3, V, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rebuilt.rows_along(logits, [2, 5]), chain.rows_along(logits, [2, 5]))
    with pytest.raises(InvalidProcessorError):
        ProcessorChain.from_spec([{"kind": "nope", "params": {}}], vocab_size=V)
    with pytest.raises(InvalidProcessorError):
        ProcessorChain.from_spec({"kind": "top_k"}, vocab_size=V)  # type: ignore[arg-type]


def test_sampling_chain_builder() -> None:
    greedy = sampling_chain(V, temperature=0, top_k=3, top_p=0.5)
    assert [p.kind for p in greedy.processors] == ["greedy"]
    logits = torch.tensor([0.0, 2.0, 2.0] + [1.0] * (V - 3))
    assert torch.equal(greedy.distribution(logits), torch.eye(V)[1])
    plain = sampling_chain(V)
    assert plain.processors == ()
    assert torch.equal(plain.distribution(logits), torch.softmax(logits, -1))
    with pytest.raises(InvalidProcessorError):
        sampling_chain(V, temperature=-1.0)


def test_stop_tokens_union_over_automata() -> None:
    chain = ProcessorChain([StopSequences([[0]]), Greedy(), StopSequences([[5, 6], [7]])], vocab_size=V)
    assert chain.stop_tokens() == frozenset({0, 7})
    assert chain.stop_sets_along([5, 6, 5]) == [
        frozenset({0, 7}),
        frozenset({0, 6, 7}),
        frozenset({0, 7}),
        frozenset({0, 6, 7}),
    ]
    assert ProcessorChain([], vocab_size=V).stop_sets_along([1, 2]) == [frozenset()] * 3
    with pytest.raises(DraftIdOutOfVocabError):
        chain.stop_sets_along([V])


def test_refusals() -> None:
    chain = ProcessorChain([TopK(2)], vocab_size=V)
    with pytest.raises(ShapeMismatchError):
        chain.distribution(torch.zeros(2, V + 1))
    with pytest.raises(ShapeMismatchError):
        chain.distribution(torch.zeros(1, 2, V))
    with pytest.raises(ShapeMismatchError):
        chain.distribution(torch.zeros(V, dtype=torch.int64))
    with pytest.raises(ShapeMismatchError):
        chain.rows_along(torch.zeros(3, V), [1])  # 3 rows need 2 path tokens
    with pytest.raises(NonFiniteProbabilityError):
        chain.distribution(torch.tensor([float("nan")] + [0.0] * (V - 1)))
    with pytest.raises(NonFiniteProbabilityError):
        chain.distribution(torch.tensor([float("inf")] + [0.0] * (V - 1)))
    masked = ProcessorChain([LogitBias({0: 1.0})], vocab_size=V)
    with pytest.raises(InvalidProcessorError):
        masked.distribution(torch.full((2, V), NEG_INF))
    empty_grammar = ProcessorChain([TokenGrammar(1, 0, {})], vocab_size=V)
    with pytest.raises(InvalidProcessorError):
        empty_grammar.distribution(torch.zeros(V))
    with pytest.raises(InvalidProcessorError):
        ProcessorChain([TopK(2)], vocab_size=0)
    with pytest.raises(InvalidProcessorError):
        ProcessorChain([LogitBias({V: 1.0})], vocab_size=V)
    with pytest.raises(InvalidProcessorError):
        ProcessorChain([], vocab_size=V, softmax="exp_race")
    with pytest.raises(InvalidProcessorError):
        ProcessorChain(["top_k"], vocab_size=V)  # type: ignore[list-item]
    with pytest.raises(InvalidProcessorError):
        ProcessorChain([Temperature(1e-30)], vocab_size=V).distribution(torch.tensor([1e10] * V))


def test_rows_are_normalised_and_keep_dtype() -> None:
    chain = sampling_chain(V, temperature=0.5, top_p=0.9, repetition_penalty=1.5)
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(4, V, generator=torch.Generator().manual_seed(9)).to(dtype)
        rows = chain.rows_along(logits, [1, 2, 3])
        assert rows.dtype == dtype
        sums = rows.to(torch.float64).sum(-1)
        assert bool(((sums - 1).abs() <= V * torch.finfo(dtype).eps).all())
    assert chain.rows_along(torch.zeros(0, V), []).shape == (0, V)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_chain_on_cuda_matches_cpu() -> None:
    chain = sampling_chain(
        V,
        temperature=0.7,
        top_k=8,
        top_p=0.9,
        min_p=0.01,
        repetition_penalty=1.3,
        frequency_penalty=0.2,
        presence_penalty=0.1,
        logit_bias={1: 0.5},
        stop_sequences=[[2]],
        grammar=cyclic_grammar(),
    )
    logits = torch.randn(4, V, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    path = admissible_path(chain, random.Random(4), 3)
    cpu = chain.rows_along(logits, path)
    gpu = chain.rows_along(logits.cuda(), path)
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float64
    # Same masks; float64 exp on the two devices differs by a few ulp, normalised over V = 12 terms.
    assert torch.equal(gpu.cpu() > 0, cpu > 0)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend", list(SoftmaxBackend))
def test_a_greedy_chain_writes_the_one_hot_the_softmax_would_give(backend: SoftmaxBackend) -> None:
    """The one-hot shortcut equals masking plus softmax bit for bit (ties, stops after it, -inf refused)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, V, generator=gen)
    logits[2, 3] = logits[2, 7] = logits[2].max() + 1.0  # a tie: the lower id wins
    chain = ProcessorChain(
        [RepetitionPenalty(1.3), Greedy(), StopSequences([[5, 6], [7]])], vocab_size=V, softmax=backend
    )
    path = [4, 5, 6, 7, 1]
    general = chain.processors[0].apply_along(logits, path)
    for p in chain.processors[1:]:
        general = p.apply_along(general, path)
    expected = softmax(general, backend)
    got = chain.rows_along(logits, path)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert int(got[2].argmax()) == 3 and float(got.sum()) == 6.0
    assert torch.equal(chain.distribution(logits[0]), softmax(Greedy().apply(logits[:1]), backend)[0])
    banned = logits.clone()
    banned[1] = float("-inf")
    with pytest.raises(InvalidProcessorError, match="no allowed token in rows \\[1\\]"):
        ProcessorChain([Greedy()], vocab_size=V).rows_along(banned, path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_chain_that_starts_greedy_checks_its_logits_in_the_arg_max_pass(dtype: torch.dtype) -> None:
    """With no processor before the arg-max, the arg-max pass is the finiteness check: the rows (of
    rows_along and distribution) are the general path's one-hot, and a NaN or +inf anywhere in any row is
    refused as the checked path refuses it (float32/float64 take numpy's arg-max, bfloat16 torch's)."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(4, V, generator=gen).to(dtype)
    logits[1, 2] = logits[1, 9] = logits[1].max() + 1  # a tie: the lower id wins
    chain = ProcessorChain([Greedy(), StopSequences([[5, 6]])], vocab_size=V)
    path = [5, 6, 1]
    expected = softmax(Greedy().apply(logits), SoftmaxBackend.MAX_SHIFT)
    got = chain.rows_along(logits, path)
    assert got.dtype == dtype and torch.equal(got, expected)
    assert int(got[1].argmax()) == 2
    assert torch.equal(chain.distribution(logits[1]), expected[1])
    _assert_refuses_bad_rows(chain, logits, path)


@pytest.mark.parametrize(
    "processors",
    [
        [Temperature(0.7), StopSequences([[5, 6]])],
        [LogitBias({0: -1e30, 3: 2.0}), Temperature(1.3)],
        [],
    ],
    ids=["temperature-stop", "bias-temperature", "empty"],
)
def test_a_chain_that_keeps_non_finite_logits_refuses_them_from_its_processed_maxima(
    processors: list[LogitProcessor],
) -> None:
    """Temperature, logit bias and identities keep a NaN or +inf non-finite, so their chain checks the raw
    logits only when a processed row maximum is not finite: NaN and +inf anywhere (a heavily biased column
    included) are refused as NonFiniteProbabilityError, before an all -inf row is reported; an overflow of
    finite logits is the processors' fault (InvalidProcessorError)."""
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(13))
    path = [5, 6, 1]
    chain = ProcessorChain(processors, vocab_size=V)
    assert torch.allclose(chain.rows_along(logits, path).sum(-1), torch.ones(4, dtype=logits.dtype))
    _assert_refuses_bad_rows(chain, logits, path, empty_row=1)
    overflowing = ProcessorChain([*processors, Temperature(1e-300)], vocab_size=V)
    with pytest.raises(InvalidProcessorError, match="NaN or \\+inf logits"):
        overflowing.distribution(torch.full((V,), 1e10, dtype=torch.float64))


def _assert_refuses_bad_rows(
    chain: ProcessorChain, logits: torch.Tensor, path: list[int], *, empty_row: int | None = None
) -> None:
    """NaN and +inf at a first, last or arg-max column are refused (NonFiniteProbabilityError) by
    ``rows_along`` and ``distribution``, also when row ``empty_row`` is all -inf (the non-finite input is
    named first); an all -inf row 2 alone is a row with no allowed token (InvalidProcessorError)."""
    for bad in (float("nan"), float("inf")):
        for row, column in ((0, 0), (2, V - 1), (3, int(logits[3].argmax()))):
            broken = logits.clone()
            broken[row, column] = bad
            if empty_row is not None:
                broken[empty_row] = float("-inf")
            with pytest.raises(NonFiniteProbabilityError, match="NaN or \\+inf"):
                chain.rows_along(broken, path)
            with pytest.raises(NonFiniteProbabilityError, match="NaN or \\+inf"):
                chain.distribution(broken[row])
    banned = logits.clone()
    banned[2] = float("-inf")
    with pytest.raises(InvalidProcessorError, match="no allowed token in rows \\[2\\]"):
        chain.rows_along(banned, path)
