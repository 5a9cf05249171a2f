"""Structural probes (Hewitt & Manning 2019): tree distances and depths, UUAS, Spearman, the
right-branching baseline on hand examples, and probes that recover a tree a linear map away."""
import pytest
import torch

from lmforge.analysis.probe_fit import FitConfig
from lmforge.analysis.structural_probe import (
    Sentences,
    mst_edges,
    right_branching_uuas,
    root_accuracy,
    spearman_by_length,
    train_structural,
    tree_depths,
    tree_distances,
    uuas,
)
from lmforge.data.treebank import treebank

# "the old dog near the house runs ." : the->dog, old->dog, dog->runs, near->house, the->house,
# house->dog, runs root, .->runs
HAND = {"words": ["the", "old", "dog", "near", "the", "house", "runs", "."],
        "upos": ["DET", "ADJ", "NOUN", "ADP", "DET", "NOUN", "VERB", "PUNCT"],
        "heads": [2, 2, 6, 5, 5, 2, -1, 6]}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_tree_distances_and_depths_on_a_hand_tree():
    d = tree_distances(HAND["heads"])
    assert d[0, 1] == 2 and d[0, 6] == 2 and d[3, 6] == 3 and d[3, 7] == 4 and d[1, 4] == 3
    assert torch.equal(d, d.T) and torch.all(d.diagonal() == 0)
    assert tree_depths(HAND["heads"]).tolist() == [2, 2, 1, 3, 3, 2, 0, 1]


def test_gold_distances_score_a_perfect_uuas_and_spearman():
    records = treebank(50, seed=4)
    gold = [tree_distances(r["heads"]) for r in records]
    assert uuas(gold, records) == 1.0
    assert spearman_by_length(gold, gold) == pytest.approx(1.0)
    depths = [tree_depths(r["heads"]) for r in records]
    assert root_accuracy(depths, records) == 1.0


def test_right_branching_baseline_on_hand_examples():
    # gold edges without punctuation: the-dog, old-dog, dog-runs, near-house, the-house, house-dog (6);
    # the chain the-old-dog-near-the-house-runs finds old-dog and the-house only
    assert right_branching_uuas([HAND]) == pytest.approx(2 / 6)
    chain = {"words": ["a", "b", "c", "."], "upos": ["X", "X", "X", "PUNCT"], "heads": [1, 2, -1, 2]}
    assert right_branching_uuas([chain]) == 1.0


def test_uuas_leaves_punctuation_out_and_counts_edges_over_the_corpus():
    predicted = tree_distances(HAND["heads"]).clone()
    predicted[0, 2] = predicted[2, 0] = 9.0  # the-dog now far apart: the MST attaches "the" elsewhere
    assert uuas([predicted], [HAND]) == pytest.approx(5 / 6)
    assert uuas([predicted, tree_distances(HAND["heads"])], [HAND, HAND]) == pytest.approx(11 / 12)


def test_minimum_spanning_tree_of_a_hand_matrix():
    d = torch.tensor([[0, 1, 5, 4], [1, 0, 2, 6], [5, 2, 0, 3], [4, 6, 3, 0]], dtype=torch.float)
    assert mst_edges(d) == {(0, 1), (1, 2), (2, 3)}


def test_spearman_by_length_on_hand_examples():
    depth = torch.tensor([0.0, 1, 2, 3, 4])
    assert spearman_by_length([depth], [depth]) == pytest.approx(1.0)
    assert spearman_by_length([-depth], [depth]) == pytest.approx(-1.0)
    assert spearman_by_length([depth * 10 + 3], [depth]) == pytest.approx(1.0)  # ranks only
    short = torch.tensor([0.0, 1, 2])
    assert spearman_by_length([short], [short]) != spearman_by_length([short], [short])  # nan: length < 5
    # lengths are averaged first: one sentence of length 5 weighs as much as two of length 6
    six = torch.arange(6.0)
    assert spearman_by_length([depth, six, six], [depth, -six, -six]) == pytest.approx(0.0)


def path_features(records):
    """Per sentence, each word's indicator of the tree edges on its path to the root: squared L2
    distances between these are exactly the tree distances, norms the depths."""
    features = []
    for r in records:
        n, heads = len(r["words"]), r["heads"]
        h = torch.zeros(1, n, 64)  # edge e = the arc from word e to its head
        for i in range(n):
            at = i
            while heads[at] != -1:
                h[0, i, at] = 1.0
                at = heads[at]
        features.append(h + 0.05 * torch.randn_like(h))
    return features


@pytest.mark.parametrize("kind", ["distance", "depth"])
def test_a_probe_recovers_a_tree_that_is_a_linear_map_away(kind):
    torch.manual_seed(0)
    records = {k: treebank(n, seed=s) for k, n, s in (("train", 150, 1), ("dev", 30, 2), ("test", 30, 3))}
    data = []
    for k in ("train", "dev", "test"):
        feats = path_features(records[k])
        offsets = torch.tensor([0] + [f.shape[1] for f in feats]).cumsum(0).tolist()
        data.append(Sentences(torch.cat(feats, 1), offsets, records[k], kind))
    (scores,) = train_structural(kind, *data, [0], FitConfig(epochs=25, rank=64, lr=3e-3), seed=0)
    if kind == "distance":
        assert scores["uuas"] > 0.9 and scores["dspr"] > 0.9
        assert scores["uuas"] > right_branching_uuas(records["test"]) + 0.2
    else:
        assert scores["root_accuracy"] > 0.9 and scores["nspr"] > 0.9
