"""Stop strings end a row when the text ends inside the token just emitted (transformers' rule)."""

from __future__ import annotations

import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.hf import SpecroundGenerateOutput, generate
from specround.sampling.processors import StopStrings
from tests.hf._models import tiny_llama


class _Letters:
    """A stand-in tokenizer: token t reads as two letters."""

    def text(self, token: int) -> str:
        return "abcdefghij"[token % 10] + "klmnopqrst"[token // 10 % 10]

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        del skip_special_tokens
        return ["".join(self.text(t) for t in seq) for seq in ids]


def test_the_automaton_stops_where_the_string_ends_inside_a_token() -> None:
    texts = {0: "xa", 1: "b", 2: "bc", 3: "q", 4: "cab"}
    stops = StopStrings(["ab"], texts)
    assert stops.stop_tokens() == (4,)  # only "cab" holds the whole string
    stops.advance(0)  # text "...xa"
    assert stops.stop_tokens() == (1, 2, 4)  # "a" + "b..." ends in the new token
    assert stops.stop_sets_along([3]) == [frozenset({1, 2, 4}), frozenset({4})]
    twin = StopStrings.from_spec(stops.params(), stops.state())
    assert twin.stop_tokens() == stops.stop_tokens() and twin.state() == {"tail": "a"}


def test_generation_ends_at_a_stop_string() -> None:
    model, tokenizer = tiny_llama(0), _Letters()
    ids = torch.tensor([[3, 4, 7, 3, 4, 9]])
    plain = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)[0, 6:].tolist()
    text = tokenizer.batch_decode([plain])[0]
    stop = text[7:9]  # the end of token 3 and the start of token 4
    first = text.find(stop)
    ends_in = next(i for i in range(len(plain)) if 2 * (i + 1) >= first + 2)  # two letters per token
    out = generate(
        model,
        ids,
        tokenizer=tokenizer,
        stop_strings=[stop],
        log=MemoryEventLog(),
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=None,
        prompt_lookup_num_tokens=2,
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert out.sequences[0, 6:].tolist() == plain[: ends_in + 1]
    assert out.finish_reasons == ("stop",)
