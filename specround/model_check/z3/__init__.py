"""The z3 side of the model checker: a model of the round protocol, the coupling, and their proofs.

One module per part:

* :mod:`.proofs`: what a proof is (an :class:`~.proofs.Obligation` built by a registered
  :class:`~.proofs.Proof`), the :class:`~.proofs.ProofRegistry` every family registers with, and
  :func:`~.proofs.all_proofs`;
* :mod:`.proof_runner`: deciding proofs, their results and the
  ``python -m specround.model_check.z3.proof_runner`` table;
* the protocol model: :mod:`.terms` (token lists as z3 arrays), :mod:`.protocol_state` (state,
  configuration, round inputs), :mod:`.rules` (the small rules one round is made of),
  :mod:`.transition` (one round attempt composed from the rules, the transition relation, log replay,
  conformance);
* :mod:`.invariants`: the initial state, the state invariants and what every round attempt must satisfy;
* :mod:`.protocol_proofs`: induction, faults, fencing, bounded runs; :mod:`.regressions`: sat-trace
  regressions; :mod:`.pipelined_rounds` and :mod:`.pipelined_proofs`: pipelined publication (round t + 1
  built on t's staged successor while t's write fails, conflicts, or meets F-5 / F-6); :mod:`.hash_chain`:
  the log's hash chain (INV-9);
* :mod:`.coupling`: the one-token coupling and the prefix induction; :mod:`.decision_proofs`: the sampler's
  decisions re-derived from logged values (INV-10).

Deliberately broken variants of the model are not written into it: they are mutations of its rules,
declared with the code-path mutations in :mod:`specround.model_check.mutants`.
"""
