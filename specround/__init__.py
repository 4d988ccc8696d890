"""specround: exact speculative decoding run as an audited, event-sourced transaction.

A cheap proposer drafts K tokens; the target scores them in one pass; the exact sampler accepts each with
min(1, p/q), corrects the first rejection from the normalised residual max(p - q, 0), and emits a bonus
target token when every draft survives. Each such **round** is a transaction
ROUND_READY -> VERIFIED_TEMPORARY -> DECIDED -> STAGED -> PUBLISHED | ABORTED whose events are appended to
a SQL log that an auditor can replay and re-check.

Vocabulary (the same words are used in ``specs/`` and throughout the code):

request
    One generation stream with its own seed, processors, stop rules and budget.
round
    One draft / verify / decide / stage / publish cycle of one request.
step
    One engine iteration that runs the rounds of a batch of requests together (one database transaction).
output O
    Every token the request has emitted (prompt included), in order.
committed cache C
    The tokens whose target K/V rows are authoritative.
frontier F
    The one emitted token that has no K/V row yet; for an unfinished request C == O[:-1] and F == O[-1].
position P
    The absolute position of the next input row (the length of C).
processor state G
    The ordered, declared logit processors with the state of the stateful ones (penalties, automata).
RNG counters R
    The next unused counter of each counter-based stream (PROPOSAL, ACCEPT, TERMINAL).
generation V
    The request's publication version; publishing is a compare-and-swap on it.
draft tokens d_1..d_K, q rows
    The proposal and the processed proposal distributions that actually sampled it.
p rows p_1..p_{K+1}
    The processed target distributions along the drafted path; p_{K+1} owns the bonus.
A
    The number of accepted drafts. **terminal**: correction | bonus | stop.
layout
    ``replay_frontier`` (the verify pass replays the frontier) or ``retained_frontier`` (the frontier's
    K/V row and p_1 already exist). Both publish the same successor.
"""

from specround.errors import SpecroundError
from specround.sampling.rng import uniforms
from specround.sampling.types import PAD_ID, Layout, SamplerBatch, SamplerDecision, Stream, TerminalKind

__all__ = [
    "PAD_ID",
    "Layout",
    "SamplerBatch",
    "SamplerDecision",
    "SpecroundError",
    "Stream",
    "TerminalKind",
    "uniforms",
]

__version__ = "0.1.0"
