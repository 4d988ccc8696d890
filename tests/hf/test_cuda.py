"""specround.hf on a CUDA model: the same greedy rows as transformers' own generate there, a log that audits.

Skipped without a CUDA device (the CI machine has none); run where one is lent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from specround.audit import audit_log
from specround.hf import SpecroundGenerateOutput, generate
from tests.hf._models import tiny_llama

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

IDS = torch.tensor([[0, 0, 3, 4, 7, 9], [11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 20, 21]])
MASK = (torch.arange(6)[None] >= torch.tensor([[2], [0], [4]])).long()


@pytest.mark.parametrize("draft", ["assistant", "lookup"])
def test_greedy_rows_on_cuda_equal_transformers_generate_there(draft: str, tmp_path: Path) -> None:
    cuda = torch.device("cuda")
    model = tiny_llama(0).to(cuda)
    ids, mask = IDS.to(cuda), MASK.to(cuda)
    reference = model.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None
    )
    extra: dict[str, Any] = (
        {"assistant_model": tiny_llama(1).to(cuda), "k": 3}
        if draft == "assistant"
        else {"prompt_lookup_num_tokens": 3}
    )
    log = tmp_path / "cuda.sqlite"
    out = generate(
        model,
        ids,
        attention_mask=mask,
        log=str(log),
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=None,
        return_dict_in_generate=True,
        output_scores=True,
        **extra,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert out.sequences.device.type == "cuda"  # where transformers returns them
    assert out.scores is not None and all(frame.device.type == "cuda" for frame in out.scores)
    assert torch.equal(out.sequences, reference)
    assert out.totals.generated == 3 * 12
    from specround.adapters.sql import SqlEventLog

    with SqlEventLog.open(str(log)) as opened:
        report = audit_log(opened)
    assert report.ok, report


def test_sampled_rows_on_cuda_are_reproducible_from_the_seed(tmp_path: Path) -> None:
    cuda = torch.device("cuda")
    model = tiny_llama(0).to(cuda)
    runs = [
        generate(
            model,
            IDS.to(cuda),
            attention_mask=MASK.to(cuda),
            assistant_model=tiny_llama(1).to(cuda),
            k=3,
            log=str(tmp_path / f"run{index}.sqlite"),
            max_new_tokens=12,
            do_sample=True,
            temperature=0.9,
            top_k=20,
            eos_token_id=None,
            seed=7,
        )
        for index in range(2)
    ]
    assert isinstance(runs[0], torch.Tensor) and isinstance(runs[1], torch.Tensor)
    assert torch.equal(runs[0], runs[1])
