"""Classification and regression metrics against values computed by hand; generation metrics against
sacrebleu and rouge-score on golden texts."""
import math

import pytest

from lmforge.tasks import metrics

GOLD = ["1", "1", "1", "0", "0", "0"]
PRED = ["1", "1", "0", "0", "0", "1"]  # tp 2, fn 1, tn 2, fp 1


def test_accuracy_f1_matthews_binary():
    assert metrics.accuracy(GOLD, PRED) == pytest.approx(4 / 6)
    # positive class = the second label: precision 2/3, recall 2/3
    assert metrics.f1(GOLD, PRED, ["0", "1"]) == pytest.approx(2 / 3)
    # (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (4 - 1) / 9
    assert metrics.matthews(GOLD, PRED) == pytest.approx(1 / 3)


def test_macro_f1_with_three_labels():
    gold, pred = ["a", "a", "b", "b", "c", "c"], ["a", "b", "b", "b", "c", "a"]
    # a: p 1/2 r 1/2 f 1/2; b: p 2/3 r 1 f 4/5; c: p 1 r 1/2 f 2/3
    assert metrics.f1(gold, pred, ["a", "b", "c"]) == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)



def test_macro_f1_leaves_out_a_label_neither_true_nor_predicted_as_sklearn_does():
    from sklearn.metrics import f1_score

    # a split without class "c" that the model never predicts: perfect predictions score 1, not 2/3
    assert metrics.f1(["a", "b", "a"], ["a", "b", "a"], ["a", "b", "c"]) == 1.0
    gold, pred = ["a", "b", "a", "b"], ["a", "b", "b", "b"]
    assert metrics.f1(gold, pred, ["a", "b", "c"]) == pytest.approx(f1_score(gold, pred, average="macro"))
    # a label predicted but never true still counts (its F1 is 0)
    gold, pred = ["a", "b", "a"], ["a", "b", "c"]
    assert metrics.f1(gold, pred, ["a", "b", "c"]) == pytest.approx(f1_score(gold, pred, average="macro"))

def test_pearson_spearman_mse():
    gold, pred = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 9.0]
    mx, my = 2.5, 5.0
    cov = sum((x - mx) * (y - my) for x, y in zip(gold, pred))
    r = cov / math.sqrt(sum((x - mx) ** 2 for x in gold) * sum((y - my) ** 2 for y in pred))
    assert metrics.pearson(gold, pred) == pytest.approx(r)
    assert metrics.spearman(gold, pred) == pytest.approx(1.0)  # same order
    assert metrics.spearman(gold, [4.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert metrics.mse(gold, pred) == pytest.approx((1 + 4 + 4 + 25) / 4)
    assert metrics.pearson(gold, [1.0] * 4) == 0.0  # undefined on a constant side: 0, not nan


def test_bundles_put_the_primary_metric_first():
    assert list(metrics.classification_metrics(GOLD, PRED, ["0", "1"])) == ["accuracy", "f1", "matthews"]
    assert list(metrics.regression_metrics([1.0, 2.0], [1.0, 3.0])) == ["pearson", "spearman", "mse"]


def test_length_mismatch_and_empty_are_errors():
    with pytest.raises(ValueError, match="3 gold labels but 2 predictions"):
        metrics.accuracy([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="no examples"):
        metrics.accuracy([], [])


def test_multilabel_micro_macro_f1_and_subset_accuracy_by_hand_and_as_sklearn_scores_them():
    gold = [["a", "b"], [], ["c"], ["a"]]
    pred = [["a"], [], ["b", "c"], ["a", "c"]]
    found = metrics.multilabel_metrics(gold, pred, ["a", "b", "c"])
    assert list(found) == ["micro_f1", "macro_f1", "subset_accuracy"]
    # tp a, c, a = 3; fp b, c = 2; fn b = 1; per label: a 1, b 0, c 2 / (2 + 1 + 0) = 2/3
    assert found["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))
    assert found["macro_f1"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert found["subset_accuracy"] == pytest.approx(1 / 4)
    sklearn = pytest.importorskip("sklearn.metrics")
    y = [[1, 1, 0], [0, 0, 0], [0, 0, 1], [1, 0, 0]]
    p = [[1, 0, 0], [0, 0, 0], [0, 1, 1], [1, 0, 1]]
    assert found == pytest.approx({"micro_f1": sklearn.f1_score(y, p, average="micro"),
                                   "macro_f1": sklearn.f1_score(y, p, average="macro"),
                                   "subset_accuracy": sklearn.accuracy_score(y, p)})


def test_generation_metrics_follow_sacrebleu_and_rouge_score_on_golden_texts():
    sacrebleu = pytest.importorskip("sacrebleu")
    pytest.importorskip("rouge_score")
    same = metrics.generation_metrics(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert same == {"bleu": pytest.approx(100), "rouge1": pytest.approx(100), "rouge2": pytest.approx(100),
                    "rougeL": pytest.approx(100), "gen_len": 6}
    cased = metrics.generation_metrics(["the cat sat on the mat"], ["The Cat sat on the mat"])
    assert cased["bleu"] < 100 and cased["rouge1"] == pytest.approx(100)  # BLEU keeps case, ROUGE lowers it
    stemmed = metrics.rouge(["the cats were running"], ["the cat was run"])
    assert stemmed["rouge1"] == pytest.approx(75)  # Porter stems: cats = cat, running = run
    empty = metrics.generation_metrics(["a red fox", "the blue sea"], ["", "the blue sea"])
    assert empty["rouge1"] == pytest.approx(50) and empty["gen_len"] == 1.5  # an empty text scores 0
    gold = ["the cat sat on the mat", "a dog ran in the park today"]
    predicted = ["the cat sat on a mat", "a dog ran in the park"]
    corpus = sacrebleu.corpus_bleu(predicted, [gold]).score
    sentences = sum(sacrebleu.sentence_bleu(p, [g]).score for g, p in zip(gold, predicted)) / 2
    assert metrics.bleu(gold, predicted) == pytest.approx(corpus)  # corpus-level, not the sentences' mean
    assert abs(corpus - sentences) > 1
    # rouge-score's tokenizer keeps [a-z0-9] alone: text in another script has no words, and scores 0
    assert metrics.rouge(["Москва столица"], ["Москва столица"])["rouge1"] == 0
