"""lmforge.rerank's own arguments, checked as the server's /rerank checks them: documents are a list of texts
(one text is not three documents of one character each), batch_size within embed's bound; each refusal an
OptionsError naming its argument, before the model is read."""
import re

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


def test_a_query_that_is_not_unicode_is_named_as_the_query_not_an_item_of_a_list(tmp_path):
    """The query is one text: its refusal said "query[0] is not valid Unicode", an index of no list."""
    with pytest.raises(OptionsError, match=r"^query is not valid Unicode") as refused:
        lmforge.rerank(tmp_path / "missing", "a \ud800", DOCS)
    assert refused.value.field == "query"


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

    # fine-tuning's argument beside the flag (it said "fine-tuned with --task rerank" alone)
    with pytest.raises(OptionsError, match=r"\(kind='rerank', --task rerank\), not 'cls'") as refused:
        Reranker(SimpleNamespace(kind="cls"))
    assert refused.value.field == "model"


def test_a_folder_that_is_no_reranker_is_refused_naming_the_model_in_python_and_the_cli(tmp_path):
    """lmforge.rerank on a folder never fine-tuned (or fine-tuned for cls) raised a plain ValueError about a
    random head; now an OptionsError naming model, which --rerank says too."""
    from lmforge.cli.common import UsageError
    from lmforge.cli.retrieve import _check_rerank
    from lmforge.tasks.finetune import save_model

    torch.manual_seed(0)
    plain, classifier = tmp_path / "plain", tmp_path / "cls"
    tiny("bert-base").save(plain)
    tokenizer("bert").save(plain)
    save_model(make_task("cls", tiny("bert-base"), tokenizer("bert"), [], TaskConfig(), ["a", "b"]),
               classifier)
    for folder, said in ((plain, "no task.json"), (classifier, "its task.json says cls")):
        with pytest.raises(OptionsError, match=re.escape(f"is not a reranker ({said})")) as refused:
            lmforge.rerank(folder, QUERY, DOCS)
        assert refused.value.field == "model" and "\n" not in str(refused.value)
        cli = f"--rerank {folder}: {folder} is not a reranker ({said})"
        with pytest.raises(UsageError, match=re.escape(cli)):
            _check_rerank(type("Args", (), {"rerank": str(folder)}))


def test_a_folder_that_is_no_reranker_is_refused_before_its_weights_are_read(tmp_path, monkeypatch):
    """lmforge.rerank on a folder without task.json read its weights (a model of GBs) to refuse it after;
    now its config.json (no classification head) says so first, in the same words."""
    import lmforge.io.native

    def read(*args, **kwargs):
        raise AssertionError("the weights were read")

    tiny("bert-base").save(tmp_path)
    tokenizer("bert").save(tmp_path)
    monkeypatch.setattr(lmforge.io.native, "load_weights", read)
    with pytest.raises(OptionsError, match=re.escape(f"{tmp_path} is not a reranker (no task.json)")):
        lmforge.rerank(tmp_path, QUERY, DOCS)


@pytest.mark.parametrize("activation", [None, "torch.nn.modules.activation.Sigmoid",
                                        "torch.nn.modules.linear.Identity"])
def test_scores_equal_a_cross_encoder_s_with_the_activation_its_config_names(tmp_path, activation):
    """A cross-encoder whose config.json names an Identity activation_fn scores raw logits in
    sentence-transformers; lmforge gave their sigmoid whatever the checkpoint said."""
    import json

    st = pytest.importorskip("sentence_transformers")
    from transformers import BertConfig, BertForSequenceClassification

    from tests.pipelines.test_embed import VOCAB

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, num_labels=1)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(50)  # logits away from 0, where sigmoid and identity part
    config = {"sentence_transformers": {"activation_fn": activation}} if activation else {}
    model.config.update(config)
    model.eval().save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    # and a document of some 300 pieces: read to the model's limit (512), as the cross-encoder reads it
    docs = [*DOCS, " ".join(["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 6)]
    theirs = st.CrossEncoder(str(tmp_path), device="cpu").predict([(QUERY, d) for d in docs])
    ours = dict(lmforge.rerank(tmp_path, QUERY, docs))
    assert [ours[i] for i in range(len(docs))] == pytest.approx(theirs.tolist(), abs=1e-5)
    assert (min(theirs) < 0) == (activation is not None and activation.endswith("Identity"))
    # the server's /rerank and retrieve --rerank score alike (they had given the sigmoid whatever it said)
    from lmforge.pipelines.rerank import Reranker
    from lmforge.serve.models import load_served

    (tmp_path / "task.json").write_text(json.dumps({"kind": "rerank"}))  # served as a reranker
    served, reranker = load_served("ce", tmp_path), Reranker.load(tmp_path)
    assert "rerank" in served.capabilities
    assert served.score(-1.65) == reranker.score(-1.65) and (served.score(-1.65) < 0) == (min(theirs) < 0)


def test_the_docs_say_a_score_is_the_logit_through_the_task_s_activation():
    """The rerank docs said a score was "the sigmoid of its logit" after a task's activation (a
    CrossEncoder's Identity: the logit itself) decided it; each says the activation, retrieval.md's options
    name it."""
    from pathlib import Path

    from lmforge.pipelines import rerank
    from lmforge.serve import rerank_routes

    root = Path(__file__).resolve().parents[2]
    texts = {"pipelines/rerank.py": rerank.__doc__, "serve/rerank_routes.py": rerank_routes.__doc__,
             "docs/serve.md": (root / "docs" / "serve.md").read_text(),
             "docs/retrieval.md": (root / "docs" / "retrieval.md").read_text()}
    for name, text in texts.items():
        flat = " ".join(text.split())
        assert "sigmoid of" not in flat and "activation_fn" in flat, name
    options = " ".join(texts["docs/retrieval.md"].split())
    assert "and `activation`, how a score is read from the logit" in options


def test_a_reranker_s_activation_is_checked_once_as_the_task_checks_it():
    """Reranker repeated classify.checked_activation with a plain ValueError; now the one check: an
    OptionsError naming activation, the task's taken where none is given."""
    from types import SimpleNamespace

    from lmforge.pipelines.rerank import Reranker

    with pytest.raises(OptionsError, match="activation must be one of sigmoid, identity") as refused:
        Reranker(SimpleNamespace(kind="rerank"), "tanh")
    assert refused.value.field == "activation"
    assert Reranker(SimpleNamespace(kind="rerank", activation="identity")).score(-2.0) == -2.0
    assert Reranker(SimpleNamespace(kind="rerank")).activation == "sigmoid"
