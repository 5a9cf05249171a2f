"""lmforge.rerank's own arguments, checked as the server's /rerank checks them: documents are a list of texts
(one text is not three documents of one character each), batch_size within embed's bound; each refusal an
OptionsError naming its argument, before the model is read."""
import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.tasks.finetune import TaskConfig, make_task
from tests.tasks.core import tiny, tokenizer

QUERY = "a good film"
DOCS = ["it is superb .", "the plot is dull", "great acting and a great story"]


@pytest.fixture(scope="module")
def reranker():
    """A tiny (untrained) cross-encoder: its order is arbitrary but fixed."""
    torch.manual_seed(0)
    return make_task("rerank", tiny("bert-base"), tokenizer("bert"), [], TaskConfig(max_len=24))


@pytest.mark.parametrize("arguments, field", [
    ({"documents": "abc"}, "documents"), ({"documents": b"abc"}, "documents"),
    ({"documents": []}, "documents"),
    ({"documents": ["a", 3]}, "documents"), ({"query": ""}, "query"),
    ({"documents": {"a": 1}}, "documents"), ({"documents": None}, "documents"),
    ({"documents": ["\ud800"]}, "documents"), ({"query": "\ud800"}, "query"),  # failed in the tokenizer
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),  # 2.0 reads as 2
    ({"batch_size": True}, "batch_size"),
    ({"batch_size": 10 ** 9}, "batch_size"),
])
def test_bad_arguments_name_themselves_before_the_model_is_read(tmp_path, arguments, field):
    given = {"query": QUERY, "documents": DOCS, **arguments}
    with pytest.raises(OptionsError) as refused:
        lmforge.rerank(tmp_path / "missing", **given)
    assert refused.value.field == field and "\n" not in str(refused.value)


def test_every_batch_size_gives_one_ranking_of_the_documents(reranker):
    ranked = lmforge.rerank(reranker, QUERY, DOCS)
    assert sorted(i for i, _ in ranked) == list(range(len(DOCS)))
    for batch_size in (1, 2, 65536):
        again = lmforge.rerank(reranker, QUERY, tuple(DOCS), batch_size=batch_size)
        assert [i for i, _ in again] == [i for i, _ in ranked]
        assert [s for _, s in again] == pytest.approx([s for _, s in ranked], abs=1e-5)


@pytest.mark.parametrize("arguments", [{"documents": "abc"}, {"batch_size": 0}, {"batch_size": 2.5}])
def test_a_loaded_reranker_refuses_them_too(reranker, arguments):
    """The documents "abc" once gave three results, one per character; batch_size=0 a bare range() error."""
    with pytest.raises(OptionsError) as refused:
        lmforge.rerank(reranker, **{"query": QUERY, "documents": DOCS, **arguments})
    assert refused.value.field == next(iter(arguments))


def test_documents_as_any_iterable_of_texts_rank_as_their_list(reranker):
    """A generator, a numpy array of texts or a dataset's column (an iterable, not a list) were refused, as
    embed takes them."""
    import numpy as np

    class Column:  # datasets >= 4: ds["text"] is an iterable Column, not a list
        def __init__(self, rows):
            self.rows = rows

        def __iter__(self):
            return iter(self.rows)

    want = lmforge.rerank(reranker, QUERY, DOCS)
    for given in ((d for d in DOCS), np.array(DOCS), Column(DOCS)):
        assert lmforge.rerank(reranker, QUERY, given) == want


def test_a_numpy_batch_size_reads_as_python_s_int(reranker):
    """batch_size=np.int64(2) was refused as not an integer, where an options field (top_n) took one."""
    import numpy as np

    want = lmforge.rerank(reranker, QUERY, DOCS, batch_size=2, top_n=2)
    assert lmforge.rerank(reranker, QUERY, DOCS, batch_size=np.int64(2), top_n=np.int64(2)) == want
    with pytest.raises(OptionsError) as refused:
        lmforge.rerank(reranker, QUERY, DOCS, batch_size=np.int64(0))
    assert refused.value.field == "batch_size"


def test_the_served_order_keeps_ties_in_the_documents_order_and_puts_nan_last():
    """A NaN logit sat wherever sorted() left it (its comparisons are all false)."""
    from lmforge.pipelines.rerank import order

    nan = float("nan")
    assert order([0.5, nan, 2.0, 0.5, nan, -1.0]) == [2, 0, 3, 5, 1, 4]
    assert order([nan, 1.0]) == [1, 0]


def test_a_model_of_another_task_is_refused_naming_the_model():
    """A classifier is no reranker: an OptionsError naming model (it was a plain ValueError)."""
    from types import SimpleNamespace

    from lmforge.pipelines.rerank import Reranker

    with pytest.raises(OptionsError, match="--task rerank, not 'cls'") as refused:
        Reranker(SimpleNamespace(kind="cls"))
    assert refused.value.field == "model"
