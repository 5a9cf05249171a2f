"""The rerank task: each loss (bce, listwise, distill by mse and kl) falls on a toy set whose positive is
identifiable (it repeats the query's word), validation metrics rank every document, the record format's
refusals name the line and field, and `lmforge finetune --task rerank` writes a reranker task.json."""
import json

import pytest
import torch

from lmforge.cli import main
from lmforge.config.options import OptionsError
from lmforge.tasks import task_class
from lmforge.tasks.finetune import TaskConfig
from lmforge.tasks.rerank import RerankOptions, ranking, ranking_metrics, read_rerank, rerank_record
from tests.tasks.core import tiny, tokenizer

WORDS = ["camera", "phone", "movie", "book", "battery", "screen", "sound", "price"]


def toy_records(n: int = 16) -> list:
    """query "about W"; positive "W W W works", negatives the other words'; teacher scores favour
    the positive."""
    records = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        others = [v for v in WORDS if v != w][i % 3:i % 3 + 3]
        records.append({"query": f"about the {w}", "documents": [f"the {w} {w} works", *[f"the {v} {v} works"
                        for v in others]], "label": 0, "scores": [4.0, -1.0, -2.0, -3.0], "line": i + 1})
    return records


def _train(loss: str, distill: str = "mse", steps: int = 60) -> tuple:
    torch.manual_seed(0)
    task = task_class("rerank")(tiny("bert-base", n_layers=2, n_heads=4), tokenizer(), max_len=32, loss=loss,
                                negatives=3, distill=distill)
    batch = task.collate(task.encode_all(toy_records()))
    optimiser = torch.optim.Adam(task.parameters(), lr=3e-3)
    task.train()
    first = float(task(batch).loss.detach())
    for _ in range(steps):
        optimiser.zero_grad()
        task(batch).loss.backward()
        optimiser.step()
    return first, float(task(batch).loss.detach()), task


# the steps each loss takes to fall to 0.6 of its start with a margin (listwise and KL: about 0.45 at 20)
@pytest.mark.parametrize("loss,distill,steps", [
    pytest.param("bce", "mse", 60, marks=pytest.mark.slow),  # 60 steps: ~3 s each
    ("listwise", "mse", 20),
    pytest.param("distill", "mse", 60, marks=pytest.mark.slow),
    ("distill", "kl", 20),
])
def test_each_loss_falls_and_the_positive_comes_first(loss, distill, steps):
    before, after, task = _train(loss, distill, steps)
    assert after < 0.6 * before, (before, after)  # bce: below the constant guess of 1 in 4, 0.56
    _, metrics = task.evaluate(toy_records())
    assert list(metrics) == ["mrr@10", "recall@1"] and metrics["recall@1"] >= 0.5  # chance: 1 in 4


def test_training_keeps_the_first_negatives_and_evaluation_every_document():
    task = task_class("rerank")(tiny(), tokenizer(), negatives=1)
    examples = task.encode_all(toy_records(2))
    task.train()
    assert task.collate(examples)["doc_mask"].shape == (2, 2)
    task.eval()
    assert task.collate(examples)["doc_mask"].shape == (2, 4)
    scores = task.pair_scores("about the phone", ["the phone works", "the book works"])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_ranking_metrics():
    assert ranking_metrics([0, 0], [[0, 1], [1, 2, 0]]) == {"mrr@10": pytest.approx((1 + 1 / 3) / 2),
                                                            "recall@1": 0.5}
    assert ranking_metrics([0], [[*range(1, 11), 0]])["mrr@10"] == 0  # rank 11: beyond 10
    with pytest.raises(OptionsError, match="2 gold documents but 1 rankings") as caught:
        ranking_metrics([0, 0], [[0, 1]])  # not the first record's score alone
    assert caught.value.field == "rankings"
    with pytest.raises(OptionsError, match="no records to score") as caught:
        ranking_metrics([], [])
    assert caught.value.field == "gold"


def test_distill_without_teacher_scores_is_refused():
    task = task_class("rerank")(tiny(), tokenizer(), loss="distill")
    records = [{k: v for k, v in r.items() if k != "scores"} for r in toy_records(2)]
    with pytest.raises(ValueError, match="teacher \"scores\""):
        task(task.collate(task.encode_all(records)))


@pytest.mark.parametrize("row,message", [
    ({"query": "q", "negatives": ["n"]}, r"no field\(s\) \['positive'\]"),
    ({"query": "q", "positive": "p", "negatives": []}, "negatives must be a list of at least 1"),
    ({"query": "q", "positive": "p", "negatives": "n"}, "negatives must be a list"),
    ({"query": "q", "positive": "p", "negatives": ["n", 3]}, r"negatives\[1\]: it must be non-empty text"),
    ({"query": "", "positive": "p", "negatives": ["n"]}, "query must be non-empty text"),
    ({"query": "q", "positive": "p", "negatives": ["n"], "scores": [1.0]}, "scores must be 2 finite numbers"),
    ({"query": "q", "positive": "p", "negatives": ["n"], "scores": [1.0, float("nan")]}, "scores must be 2"),
    ({"query": "q", "documents": ["d"]}, "no field 'positive'"),
])
def test_record_refusals_name_the_line_and_field(row, message):
    with pytest.raises(OptionsError, match=r"f\.jsonl:3: " + message) as err:
        rerank_record("f.jsonl:3", row)
    assert err.value.field is None and "\n" not in str(err.value)  # the message names the file and line


def test_prediction_records_and_options_bounds(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"query": "q", "documents": ["a", "b"]}) + "\n")
    (record,) = read_rerank(path, labelled=False)
    assert record["documents"] == ["a", "b"] and record["label"] is None and record["line"] == 1
    with pytest.raises(OptionsError, match="negatives must be an integer >= 1 and <= 999"):
        RerankOptions(negatives=1000)
    with pytest.raises(OptionsError, match="loss='hinge' is not one of bce, listwise, distill"):
        TaskConfig.from_dict({"loss": "hinge"})


def test_finetune_command_writes_a_reranker(tmp_path):
    lines = [json.dumps({"query": r["query"], "positive": r["documents"][0], "negatives": r["documents"][1:]})
             for r in toy_records(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    model = tmp_path / "tiny"
    tiny("bert-base", n_layers=2, n_heads=4).save(model)
    tokenizer().save(model)
    argv = ["finetune", "--model", str(model), "--task", "rerank", "--train", str(tmp_path / "train.jsonl"),
            "--valid", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "run"), "--steps", "3",
            "batch_size=4", "loss=bce", "negatives=2", "max_len=32", "progress=false"]
    assert main(argv) == 0
    info = json.loads((tmp_path / "run" / "final" / "task.json").read_text())
    assert info["kind"] == "rerank" and info["loss"] == "bce" and info["negatives"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["primary"] == "mrr@10"
    assert main(["evaluate", "--model", str(tmp_path / "run" / "final"),
                 "--data", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "predictions.jsonl")]) == 0
    row = json.loads((tmp_path / "predictions.jsonl").read_text().splitlines()[0])
    assert sorted(row["prediction"]) == [0, 1, 2, 3] and row["gold"] == 0  # a ranking of the 4 documents
    assert main(["finetune", "--model", str(model), "--task", "rerank",
                 "--train", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "bad"),
                 "--columns", "text=q"]) == 2


def test_tied_scores_never_rank_the_positive_first():
    # a collapsed reranker (every score equal) must not score as perfect: the positive is documents[0]
    assert ranking([0.5, 0.5, 0.5]) == [2, 1, 0]
    assert ranking_metrics([0], [ranking([0.5] * 4)]) == {"mrr@10": 0.25, "recall@1": 0.0}
    assert ranking([1.0, float("nan"), 2.0]) == [2, 0, 1]  # a NaN score ranks last
    assert ranking([0.1, 0.9, 0.5]) == [1, 2, 0]  # untied scores: plain descending order


def test_distill_training_records_without_teacher_scores_are_refused_before_any_step(tmp_path, capsys):
    """loss=distill failed inside the first batch whose records lacked "scores" (a ValueError after model and
    optimiser were built); now the training file's line is named before any step, and a validation file
    without scores (ranked by the model's own) is accepted."""
    rows = [{"query": r["query"], "positive": r["documents"][0], "negatives": r["documents"][1:],
             "scores": r["scores"]} for r in toy_records(8)]
    del rows[5]["scores"]
    bare = [{k: v for k, v in row.items() if k != "scores"} for row in rows]
    for name, records in (("train.jsonl", rows), ("valid.jsonl", bare)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    model = tmp_path / "tiny"
    tiny("bert-base", n_layers=2, n_heads=4).save(model)
    tokenizer().save(model)
    argv = ["finetune", "--model", str(model), "--task", "rerank", "--valid", str(tmp_path / "valid.jsonl"),
            "--steps", "2", "batch_size=4", "loss=distill", "negatives=2", "max_len=32", "progress=false"]
    assert main([*argv, "--train", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.jsonl: line 6: loss=distill needs every training record's teacher \"scores\"" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "bad" / "checkpoints").exists()
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5] + rows[6:]))
    assert main([*argv, "--train", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "run")]) == 0


def test_a_bad_python_record_is_refused_naming_the_split_and_the_argument_it_came_in(tmp_path):
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig

    bad = [{"query": "q", "positive": "p", "negatives": []}]
    for train, valid, split, field in ((bad, None, "training", "train"),
                                       (toy_records(2), bad, "validation", "validation")):
        with pytest.raises(OptionsError, match=f"^{split}: .*negatives must be a list of at least 1") as err:
            finetune(tiny(), tokenizer(), "rerank", train, valid, tmp_path, TrainConfig(steps=1),
                     log=lambda *a: None)
        assert err.value.field == field and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("bad", ["abc", ["q"], None, {}])
def test_a_python_rerank_record_that_is_no_dict_is_refused_naming_its_argument(bad):
    """A rerank record given in Python that is no dict failed inside the task (AttributeError, TypeError)."""
    from lmforge.tasks.fields import given_records

    good = {"query": "q", "positive": "p", "negatives": ["n"]}
    with pytest.raises(OptionsError, match=r"^train:2: a record is a dict of fields") as caught:
        given_records([good, bad], "rerank", "train")
    assert caught.value.field == "train"
    assert [r["line"] for r in given_records([good, good], "rerank", "train")] == [1, 2]
