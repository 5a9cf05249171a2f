"""Structural probes (Hewitt & Manning 2019): tree distances and depths, UUAS, Spearman, the
right-branching baseline on hand examples, and probes that recover a tree a linear map away."""
from itertools import pairwise

import pytest
import torch

from lmforge.analysis.probe_fit import FitConfig
from lmforge.analysis.structural_probe import (Sentences, StructuralProbe, mst_edges, right_branching_uuas,
                                               root_accuracy, spearman_by_length, structural_loss,
                                               train_structural, tree_depths, tree_distances, uuas)
from lmforge.data.conllu import read_conllu
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


def test_ptb_punctuation_tags_of_a_conllx_file_are_left_out_of_uuas_and_root_accuracy(tmp_path):
    # "dogs bark , cats meow ." in CoNLL-X with PTB tags (Hewitt & Manning's data): the 4th column,
    # read as upos, holds "," and "." rather than PUNCT. Gold heads: dogs->bark, bark root, ,->bark,
    # cats->meow, meow->bark, .->bark.
    tags, heads = ["NNS", "VBP", ",", "NNS", "VBP", "."], [2, 0, 2, 5, 2, 2]
    lines = [f"{i}\t{w}\t_\t{t}\t{t}\t_\t{h}\tdep\t_\t_"
             for i, (w, t, h) in enumerate(zip("dogs bark , cats meow .".split(), tags, heads), 1)]
    (tmp_path / "s.conllx").write_text("\n".join(lines) + "\n\n")
    [record] = read_conllu(tmp_path / "s.conllx")
    # predicted: dogs-bark 1, cats-meow 1, ,-cats 1, .-meow 1, bark-meow 2, every other pair 5
    d = torch.full((6, 6), 5.0).fill_diagonal_(0)
    for i, j, v in [(0, 1, 1), (3, 4, 1), (2, 3, 1), (5, 4, 1), (1, 4, 2)]:
        d[i, j] = d[j, i] = v
    # punctuation out (the paper): MST of words 0, 1, 3, 4 = dogs-bark, cats-meow, bark-meow, all
    # 3 gold edges between them found: 3/3
    assert uuas([d], [record]) == 1.0
    # punctuation in (every tag a word): MST of all six = the four 1-edges + bark-meow; of the 5 gold
    # edges dogs-bark, cats-meow, bark-meow are found, ,-bark and .-bark are not: 3/5
    as_words = {**record, "upos": ["X"] * 6}
    assert uuas([d], [as_words]) == pytest.approx(3 / 5)
    # root accuracy: "," is the shallowest word, "bark" the shallowest that is not punctuation
    depth = torch.tensor([2.0, 1, 0, 2, 2, 3])
    assert root_accuracy([depth], [record]) == 1.0 and root_accuracy([depth], [as_words]) == 0.0


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


def test_a_probes_learning_rate_drops_tenfold_after_an_epoch_without_a_better_dev_loss():
    """Hewitt & Manning's code divides the lr by 10 (ReduceLROnPlateau, factor 0.1, patience 0) after
    each epoch whose dev loss is no better; lmforge trained at a fixed lr. Each of the G probes has its
    own: probe 0 improves every epoch and keeps lr, probe 1 stalls from epoch 2 and its steps shrink."""
    from lmforge.analysis.probe_fit import fit
    from lmforge.analysis.structural_probe import LR_CUT, StructuralProbe, dev_score, structural_loss

    torch.manual_seed(0)
    records = treebank(40, seed=1)
    feats = path_features(records)
    offsets = torch.tensor([0] + [f.shape[1] for f in feats]).cumsum(0).tolist()
    data = Sentences(torch.cat(feats, 1).expand(2, -1, -1), offsets, records, "distance")
    probe, seen = StructuralProbe("distance", 64, 8, [0, 1]), []

    def scripted(module, dev):  # probe 0 better each epoch, probe 1 never after its first
        seen.append(module.B.detach().clone())
        dev_score(module, dev)
        return torch.tensor([float(len(seen)), 0.0])

    config = FitConfig(epochs=4, rank=8, lr=1e-3, patience=10, batch_size=10)
    history = fit(probe, data, data, config, seed=0, loss=structural_loss, score=scripted, lr_cut=LR_CUT)
    assert LR_CUT == 0.1 and history["lr"] == pytest.approx([1e-3, 1e-3 * 0.1 ** 3])
    moved = [(b - a).abs().flatten(1).mean(1) for a, b in pairwise(seen)]  # (G,) per epoch from the 2nd
    assert 0.5 < float(moved[1][0] / moved[0][0]) < 2  # probe 0: the same lr
    assert 0.05 < float(moved[1][1] / moved[0][1]) < 0.2  # probe 1: lr / 10 after epoch 2
    assert 0.05 < float(moved[2][1] / moved[1][1]) < 0.2  # and again after epoch 3


@pytest.mark.parametrize("kind", ["distance", "depth"])
def test_the_loss_is_l1_over_pairs_by_length_squared_or_over_words_by_length(kind):
    """Hewitt & Manning's loss on a padded batch of a 2- and a 3-word sentence: per sentence the L1 error
    summed over its real pairs / n^2 (depth: words / n), padding left out, then the mean over sentences;
    the probe's prediction is ||B(h_i - h_j)||^2 (depth: ||B h_i||^2)."""
    torch.manual_seed(0)
    probe = StructuralProbe(kind, 4, 3, [0])
    torch.nn.init.normal_(probe.B)
    h = torch.randn(1, 2, 3, 4)  # (L, S, T, d); sentence 0's third word is padding
    x = h[0] @ probe.B[0]  # (S, T, rank)
    want_pred = (x[:, :, None] - x[:, None]).pow(2).sum(-1) if kind == "distance" else x.pow(2).sum(-1)
    torch.testing.assert_close(probe(h)[0], want_pred, atol=1e-5, rtol=1e-5)
    gold = torch.randint(0, 4, want_pred.shape).float()
    gold[0, ..., 2] = 1e6  # a padding position's gold: never counted
    if kind == "distance":
        gold[0, 2] = 1e6
    n = torch.tensor([2, 3])
    err = (want_pred - gold).abs()
    per_sentence = ([err[0, :2, :2].sum() / 4, err[1].sum() / 9] if kind == "distance"
                    else [err[0, :2].sum() / 2, err[1].sum() / 3])
    with torch.no_grad():
        loss = structural_loss(probe, (h, gold, n))
    torch.testing.assert_close(loss, sum(per_sentence) / 2, atol=1e-4, rtol=1e-5)
