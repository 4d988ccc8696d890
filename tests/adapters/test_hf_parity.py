"""Parity with transformers on the same GGUF: logits (prefill, single-token decode, packed verification),
the transformers bridge's own K/V contract, and the tokenizer and chat template.

Tolerance: transformers dequantises the same Q4_1/Q8_0 blocks to the same fp32 weights and runs the same
operations, so prefill logits agree bit for bit in practice; cached decode and verification take other
kernel blockings (fewer rows, longer key sets) and measured at most 5e-5 on logits of magnitude ~40.
``ATOL = 2e-3`` (relative 5e-5) keeps a 40x margin, far below the O(1) change that any real disagreement
(a rotary permutation left in place, a wrong eps, an off-by-one position) causes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.sampling.types import Layout
from specround.statemachine.model_ports import TargetModel, VerifyRequest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

ATOL = 2e-3
REPLAY = Layout.REPLAY_FRONTIER
RETAINED = Layout.RETAINED_FRONTIER


@pytest.fixture(scope="module")
def prompts(smollm: LlamaBundle) -> dict[str, list[int]]:
    tok, chat = smollm.tokenizer, smollm.chat
    assert tok is not None and chat is not None
    return {
        "chat": tok.encode(chat.render([{"role": "user", "content": "Name three colours."}])),
        "prose": tok.encode("The quick brown fox jumps over the lazy dog. The quick brown"),
        "code": tok.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return"),
    }


def test_prefill_logits_match(smollm: LlamaBundle, hf_smollm: Any, prompts: dict[str, list[int]]) -> None:
    for ids in prompts.values():
        ours = smollm.model.logits(torch.tensor(ids))  # [T, V]
        with torch.no_grad():
            theirs = hf_smollm.model(torch.tensor([ids])).logits[0]  # [T, V]
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_decode_and_packed_verify_match(
    smollm: LlamaBundle, hf_smollm: Any, prompts: dict[str, list[int]]
) -> None:
    """Our one packed forward over three requests vs transformers on each request alone (batch 1)."""
    ours = LlamaTarget(smollm.model, model_id=smollm.model_id)
    hf: TargetModel = hf_smollm
    ids = {f"parity-{k}": v for k, v in prompts.items()}
    ours.prefill({rid: v[:-1] for rid, v in ids.items()})
    hf.prefill({rid: v[:-1] for rid, v in ids.items()})
    drafts = dict(zip(ids, [(3_000, 12), (7_000, 400, 5), ()], strict=True))
    reqs = [VerifyRequest(rid, REPLAY, v[-1], drafts[rid]) for rid, v in ids.items()]
    packed = ours.verify(reqs)
    alone = [hf.verify([req])[0] for req in reqs]
    for a, b in zip(packed, alone, strict=True):
        assert a.logits.shape == b.logits.shape
        torch.testing.assert_close(a.logits, b.logits, atol=ATOL, rtol=0)
        ours.commit(a.request_id, a.branch, 1)
        hf.commit(b.request_id, b.branch, 1)
    # Single-token decode on the committed caches.
    for rid in ids:
        (a,) = ours.verify([VerifyRequest(rid, REPLAY, 13, ())])
        (b,) = hf.verify([VerifyRequest(rid, REPLAY, 13, ())])
        assert a.logits.shape == (1, 49152)
        torch.testing.assert_close(a.logits, b.logits, atol=ATOL, rtol=0)
        ours.discard(rid, a.branch)
        hf.discard(rid, b.branch)
        assert hf.committed_token_ids(rid) == ours.committed_token_ids(rid) == tuple(ids[rid])
        hf.release(rid)


def test_bridge_commit_and_discard_follow_the_contract(
    smollm: LlamaBundle, hf_smollm: Any, prompts: dict[str, list[int]]
) -> None:
    """The real bridge under retained_frontier (the layout with the most crop arithmetic; both layouts run
    on a tiny model in ``test_hf_tiny``): crop(-k) commits A + 1 rows, discard keeps C and the retained
    frontier (INV-1)."""
    layout = RETAINED
    hf: TargetModel = hf_smollm
    rid = f"contract-{layout.value}"
    output = list(prompts["prose"])
    hf.prefill({rid: output[:-1]})
    for drafts, accepted, terminal, abort in (((9, 9), 0, 11, True), ((9, 9, 9), 2, 11, False)):
        if layout is RETAINED:
            hf.materialize_frontier({rid: output[-1]})
        (res,) = hf.verify([VerifyRequest(rid, layout, output[-1], drafts)])
        if abort:
            hf.discard(rid, res.branch)
            assert hf.retained_frontier(rid) == (output[-1] if layout is RETAINED else None)
        else:
            hf.commit(rid, res.branch, accepted + 1)
            output = output + list(drafts[:accepted]) + [terminal]
        assert hf.committed_token_ids(rid) == tuple(output[:-1])
    if layout is RETAINED:
        hf.materialize_frontier({rid: output[-1]})
    (res,) = hf.verify([VerifyRequest(rid, layout, output[-1], (5,))])
    fresh = smollm.model.logits(torch.tensor([*output, 5]))[len(output) - 1 :]
    torch.testing.assert_close(res.logits, fresh, atol=ATOL, rtol=0)
    hf.release(rid)


def test_tokenizer_matches_transformers(smollm: LlamaBundle, hf_tokenizer: Any) -> None:
    tok = smollm.tokenizer
    assert tok is not None
    texts = [
        "Hello, world!",
        "naïve café 日本語 🙂",
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n",
        "def f(x):\n    return x ** 2  # square",
        "Prices rose 3.5% in 2024, to $1,299.",
    ]
    for text in texts:
        ids = tok.encode(text)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf_tokenizer.decode(ids)
    # Where the two differ: transformers' GGUF converter lacks SmolLM2's digit split, which only shows
    # when a run of spaces precedes a digit. Ours follows the model's own pre-tokenizer (llama.cpp's).
    assert tok.decode(tok.encode("x  12")) == "x  12"


def test_chat_template_matches_transformers(smollm: LlamaBundle, hf_tokenizer: Any) -> None:
    assert smollm.chat is not None
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    for add in (True, False):
        ours = smollm.chat.render(messages, add_generation_prompt=add)
        theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
        assert ours == theirs
