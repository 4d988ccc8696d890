"""Round lifecycle, request state, commit records, the controller, fault points and the ports it needs.

Imports ``specround.sampling`` only; adapters implement the ports defined here.

Modules: ``state`` (S = (O, C, F, P, G, R, V), the commit record, fold-based digests), ``events`` (the log's
events), ``ports`` (the event-log port), ``model_ports`` (target and proposer ports), ``lifecycle`` (the
transition table), ``rounds`` (the embedding API's records), ``controller`` (``RoundController``), ``step``
(driving a batch through the lifecycle), ``batching`` (sampler batch and decided events), ``staging``
(successors by token identity), ``binding`` (the round coordinate), ``faults`` (F-1..F-6), ``replay``
(rebuilding state from events), ``chain`` (hash-chain findings), ``records`` (fast record assembly and
canonical bytes), ``work`` (the controller's working records), ``uniform_cache`` (precomputed uniforms per
request).
"""
