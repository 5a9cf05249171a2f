"""A job's output folder is read wherever a model directory is: lmforge.load, the tokenizer, the
embedding job, --model of every command (issue 43: `quantize --out DIR` then `from_dir(DIR)`)."""
import pytest
import torch

import lmforge
from lmforge.io import find_model_dir
from lmforge.pipelines.embed import SentenceEncoder
from tests.serve.conftest import _save, _tiny, _tokenizer


@pytest.mark.parametrize("inner", ["model", "final"])  # quantize / prune; pretrain / finetune / distill
def test_every_loader_reads_a_jobs_output_folder(tmp_path, inner):
    tokenizer = _tokenizer("bert")
    _save(_tiny("bert-base", tokenizer, 3, max_seq_len=32), tokenizer, tmp_path / "run" / inner)
    run = tmp_path / "run"
    assert find_model_dir(run) == run / inner
    same = lmforge.load(run / inner)
    assert all(torch.equal(a, b) for a, b in zip(lmforge.load(run).state_dict().values(),
                                                 same.state_dict().values()))
    assert lmforge.load_tokenizer(run).vocab_size == tokenizer.vocab_size
    vectors = SentenceEncoder.from_dir(run).encode(["the cat sat"])
    assert vectors.shape[0] == 1 and torch.isfinite(vectors).all()


def test_a_folder_with_a_model_of_its_own_is_read_as_it_is(tmp_path):
    tokenizer = _tokenizer("bert")
    _save(_tiny("bert-base", tokenizer, 3, max_seq_len=32), tokenizer, tmp_path / "m")
    _save(_tiny("bert-base", tokenizer, 4, max_seq_len=32), tokenizer, tmp_path / "m" / "final")
    assert find_model_dir(tmp_path / "m") == tmp_path / "m"
