"""What a worker runs for a batch of jobs (serve/job_kinds.py)."""
from __future__ import annotations

import torch

import lmforge
from lmforge.serve.job_kinds import task_outputs
from lmforge.tasks.finetune import TaskConfig, make_task
from lmforge.tokenizer import train_tokenizer

TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog")
         for c in ("mat", "hill")]


def test_choice_records_are_batched_with_records_of_as_many_choices():
    """MultipleChoiceTask.collate pads each record to the most choices of its batch: one record of 40
    choices among records of 2 made every record 40 sequences long."""
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", vocab_size=tokenizer.vocab_size)).eval()
    task = make_task("choice", model, tokenizer, [], TaskConfig(max_len=32))
    records = [{"text": TEXTS[0], "choices": (TEXTS * 4)[:40 if i == 1 else 2]} for i in range(4)]
    examples = task.encode_all(records)
    seen, collate = [], task.collate
    task.collate = lambda batch: seen.append([len(e["choices"]) for e in batch]) or collate(batch)
    found = task_outputs(task, examples)
    assert all(len(set(sizes)) == 1 for sizes in seen) and sorted(map(len, seen)) == [1, 3]
    alone = [task.outputs([e])[0] for e in examples]  # each record's scores as if it were batched alone
    assert [len(f) for f in found] == [2, 40, 2, 2]
    for got, want in zip(found, alone):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
