"""Structural probes (Hewitt & Manning 2019): is a sentence's dependency tree a linear transform
away from a layer's word vectors?

- Distance probe: d_B(h_i, h_j)^2 = (B(h_i - h_j))^T (B(h_i - h_j)), B a (rank, d) matrix, trained so
  that the squared distances match the tree distances d_T(i, j) (path lengths), with the L1 loss
  summed over pairs and divided by the sentence's length squared. Scored by UUAS (the minimum
  spanning tree of the predicted distances against the gold undirected edges, punctuation left
  out: see words_scored) and DSpr (per word, the Spearman correlation of its predicted and gold
  distances to every word, averaged over the sentences of each length 5-50, then over those lengths).
- Depth probe: ||B h_i||^2 fit to the word's depth in the tree (L1, divided by the length).
  Scored by root accuracy (the shallowest non-punctuation word is the root) and NSpr (Spearman of
  predicted and gold depths per sentence, averaged the same way).

The right-branching baseline links each word to the next (punctuation left out); its UUAS is the
floor a probe must clear. Records are those of lmforge.data.treebank (0-based heads, -1: root).
"""
from __future__ import annotations

import math
from collections import defaultdict
from itertools import pairwise

import numpy as np
import torch
from torch import nn

from lmforge.analysis.probe_fit import FitConfig, fit

PUNCT = "PUNCT"
# the tags Hewitt & Manning's code (reporter.py, prims_matrix_to_edges / get_nopunct_argmin) leaves out
# of UUAS and root accuracy: PTB tags, which a CoNLL-X file (their PTB data) holds in the 4th column,
# read as "upos"; UD's PUNCT covers the same tokens in a CoNLL-U file. $ and # (UD: SYM) stay in, as there
PUNCT_TAGS = frozenset({PUNCT, "''", ",", ".", ":", "``", "-LRB-", "-RRB-"})
SPEARMAN_LENGTHS = (5, 50)  # the sentence lengths whose correlations are averaged, as in the paper
# the paper's code (structural-probes, regimen.py: ReduceLROnPlateau(factor=0.1, patience=0) on the
# dev loss) divides the learning rate by 10 after each epoch whose dev loss is no better
LR_CUT = 0.1


def tree_distances(heads: list) -> torch.Tensor:
    """(n, n) path lengths between the words of a tree (0-based heads, -1: root)."""
    n = len(heads)
    neighbours = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if h >= 0:
            neighbours[i].append(h)
            neighbours[h].append(i)
    out = torch.zeros(n, n)
    for start in range(n):  # a breadth-first walk from every word: O(n^2) for a tree
        seen, frontier, depth = {start}, [start], 0
        while frontier:
            depth += 1
            frontier = [j for i in frontier for j in neighbours[i] if j not in seen]
            seen.update(frontier)
            out[start, frontier] = float(depth)
    return out


def tree_depths(heads: list) -> torch.Tensor:
    """(n,) each word's distance to the root."""
    root = heads.index(-1)
    return tree_distances(heads)[root]


def gold_edges(heads: list, keep: list) -> set:
    """Undirected tree edges between words both in `keep` (indices), as (low, high) pairs."""
    kept = set(keep)
    return {(min(i, h), max(i, h)) for i, h in enumerate(heads) if h >= 0 and i in kept and h in kept}


def mst_edges(distances: torch.Tensor) -> set:
    """Undirected edges (low, high) of a minimum spanning tree of an (n, n) distance matrix (Prim)."""
    n = distances.shape[0]
    if n < 2:
        return set()
    d = distances.double()
    inside = torch.zeros(n, dtype=torch.bool)
    inside[0] = True
    best, parent, edges = d[0].clone(), torch.zeros(n, dtype=torch.long), set()
    for _ in range(n - 1):
        j = int(best.masked_fill(inside, float("inf")).argmin())
        i = int(parent[j])
        edges.add((min(i, j), max(i, j)))
        inside[j] = True
        closer = d[j] < best
        best, parent = torch.where(closer, d[j], best), torch.where(closer, torch.tensor(j), parent)
    return edges


def words_scored(record: dict, n: int) -> list:
    """Indices of the first n words that are not punctuation (what UUAS and root accuracy see).

    Punctuation is a gold tag in PUNCT_TAGS (UPOS PUNCT, or a PTB punctuation tag in that column), as
    in Hewitt & Manning's evaluation. DSpr and NSpr keep every word, as their code does."""
    return [i for i in range(n) if record["upos"][i] not in PUNCT_TAGS]


def uuas(predicted: list, records: list) -> float:
    """Undirected unlabelled attachment score: MST edges of each (n, n) predicted distance matrix
    found among the gold edges, over all gold edges; punctuation (words_scored) is removed before the
    MST is built and its gold edges are not counted, as in Hewitt & Manning's code."""
    correct = total = 0
    for dist, record in zip(predicted, records):
        keep = words_scored(record, dist.shape[0])
        gold = gold_edges(record["heads"], keep)
        found = {(keep[a], keep[b]) for a, b in mst_edges(dist[keep][:, keep])}
        correct, total = correct + len(found & gold), total + len(gold)
    return correct / total if total else float("nan")


def right_branching_uuas(records: list) -> float:
    """UUAS of the chain linking each non-punctuation word to the next one."""
    correct = total = 0
    for record in records:
        keep = words_scored(record, len(record["words"]))
        gold = gold_edges(record["heads"], keep)
        correct += len(set(pairwise(keep)) & gold)
        total += len(gold)
    return correct / total if total else float("nan")


def _rowwise_spearman(predicted: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair (tied values share their average rank); nan for a
    constant row."""
    from scipy.stats import rankdata

    a, b = rankdata(predicted, axis=-1), rankdata(gold, axis=-1)
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))


def spearman_by_length(predicted: list, gold: list, lengths: tuple = SPEARMAN_LENGTHS) -> float:
    """Hewitt & Manning's DSpr / NSpr: Spearman per row ((n, n) distances) or per sentence ((n,)
    depths), averaged over the sentences of each length in [low, high], then over the lengths."""
    by_length = defaultdict(list)
    for p, g in zip(predicted, gold):
        n = g.shape[0]
        if lengths[0] <= n <= lengths[1]:
            rho = _rowwise_spearman(np.atleast_2d(p.double().numpy()), np.atleast_2d(g.double().numpy()))
            by_length[n].extend(r for r in rho.tolist() if not math.isnan(r))
    means = [np.mean(v) for v in by_length.values() if v]
    return float(np.mean(means)) if means else float("nan")


def root_accuracy(predicted: list, records: list) -> float:
    """Fraction of sentences whose least deep predicted non-punctuation word is the gold root."""
    hits = []
    for depth, record in zip(predicted, records):
        keep = words_scored(record, depth.shape[0])
        root = record["heads"].index(-1)
        if keep and root < depth.shape[0]:
            hits.append(keep[int(depth[keep].argmin())] == root)
    return float(np.mean(hits)) if hits else float("nan")


class StructuralProbe(nn.Module):
    """G independent distance (or depth) probes, probe g a (rank, d) map B_g on layer layers[g]:
    squared distances ||B(h_i - h_j)||^2, or squared norms ||B h_i||^2 as depths."""

    init_bound = 0.05  # B ~ U(-0.05, 0.05) as Hewitt & Manning's code: predictions start near 0

    def __init__(self, kind: str, d: int, rank: int, layers: list) -> None:
        super().__init__()
        if kind not in ("distance", "depth"):
            raise ValueError(f"structural probe {kind!r} is not distance or depth")
        self.kind, self.groups = kind, len(layers)
        self.register_buffer("layers", torch.tensor(layers), persistent=False)
        self.B = nn.Parameter(torch.empty(len(layers), d, rank))  # B^T of each probe, as x @ B^T
        self.active = None  # (G,) bool while training: the probes still learning (None: all)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (L, S, T, d) -> (G', S, T, T) squared distances, or (G', S, T) depths, of the probes
        still training (all in eval mode)."""
        g = self.active if self.training and self.active is not None else slice(None)
        x = torch.einsum("gstd,gdr->gstr", h[self.layers[g]], self.B[g])  # (G', S, T, rank)
        norms = x.pow(2).sum(-1)  # (G, S, T)
        if self.kind == "depth":
            return norms
        # |x_i|^2 + |x_j|^2 - 2 x_i.x_j: never materialises the (T, T, rank) differences
        return (norms[..., :, None] + norms[..., None, :] - 2 * x @ x.transpose(-1, -2)).clamp(min=0)


class Sentences:
    """Padded sentences over a word table (L, W, d): gold distances or depths, and their lengths."""

    def __init__(self, table: torch.Tensor, offsets: list, records: list, kind: str) -> None:
        lengths = [b - a for a, b in pairwise(offsets)]
        S, T = len(lengths), max(lengths)
        self.table, self.records, self.kind = table, records, kind
        self.lengths = torch.tensor(lengths)
        self.index = torch.zeros(S, T, dtype=torch.long)  # padding points at word 0, masked out
        self.gold = torch.zeros(S, T, T) if kind == "distance" else torch.zeros(S, T)
        for s, (a, n) in enumerate(zip(offsets, lengths)):
            self.index[s, :n] = torch.arange(a, a + n)
            full = tree_distances(records[s]["heads"])
            if kind == "distance":
                self.gold[s, :n, :n] = full[:n, :n]
            else:
                self.gold[s, :n] = full[records[s]["heads"].index(-1), :n]

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows: torch.Tensor) -> tuple:
        """(h (L, S, T, d), gold, lengths (S,)) of the sentences `rows`, cut to their longest."""
        n = self.lengths[rows]
        T = int(n.max())
        gold = self.gold[rows][:, :T, :T] if self.kind == "distance" else self.gold[rows][:, :T]
        return self.table[:, self.index[rows][:, :T]], gold, n


def _errors(probe: nn.Module, batch: tuple) -> torch.Tensor:
    """(G, S) each sentence's L1 error summed over its pairs (words), divided by its length squared
    (its length)."""
    h, gold, n = batch
    real = torch.arange(h.shape[2])[None] < n[:, None]  # (S, T)
    pred = probe(h)
    if pred.dim() == 4:
        mask, norm = real[:, :, None] & real[:, None], n.float() ** 2
    else:
        mask, norm = real, n.float()
    return ((pred - gold).abs() * mask).flatten(2).sum(2) / norm


def structural_loss(probe: nn.Module, batch: tuple) -> torch.Tensor:
    """Hewitt & Manning's loss: the normalised L1 error averaged over the batch, summed over probes."""
    return _errors(probe, batch).mean(1).sum()


def dev_score(probe: nn.Module, data: Sentences) -> torch.Tensor:
    """(G,) minus each probe's mean normalised L1 error on `data` (higher is better)."""
    probe.eval()
    with torch.no_grad():
        errors = torch.cat([_errors(probe, data.batch(rows))
                            for rows in torch.arange(len(data)).split(64)], 1)
    return -errors.mean(1)


def predictions(probe: nn.Module, data: Sentences) -> list:
    """Per probe, per sentence, its (n, n) predicted distances or (n,) depths."""
    probe.eval()
    out = [[] for _ in range(probe.groups)]
    with torch.no_grad():
        for rows in torch.arange(len(data)).split(64):
            _, _, n = batch = data.batch(rows)
            for g, pred in enumerate(probe(batch[0])):
                out[g] += [p[:k, :k] if p.dim() == 2 else p[:k] for p, k in zip(pred, n.tolist())]
    return out


def structural_scores(kind: str, predicted: list, data: Sentences) -> dict:
    """distance: uuas and dspr; depth: root_accuracy and nspr."""
    n = data.lengths.tolist()
    if kind == "distance":
        gold = [g[:k, :k] for g, k in zip(data.gold, n)]
        return {"uuas": uuas(predicted, data.records), "dspr": spearman_by_length(predicted, gold)}
    gold = [g[:k] for g, k in zip(data.gold, n)]
    return {"root_accuracy": root_accuracy(predicted, data.records),
            "nspr": spearman_by_length(predicted, gold)}


def train_structural(kind: str, train: Sentences, dev: Sentences, test: Sentences, layers: list,
                     config: FitConfig, seed: int) -> list:
    """Fit a distance or depth probe on each table layer in `layers` (the learning rate cut by LR_CUT
    after an epoch without a better dev loss, early stopping on it); per layer its scores on test."""
    probe = StructuralProbe(kind, train.table.shape[-1], config.rank, layers)
    per_sentence = FitConfig(**{**config.__dict__, "batch_size": config.sentence_batch})
    history = fit(probe, train, dev, per_sentence, seed, loss=structural_loss, score=dev_score,
                  lr_cut=LR_CUT)
    return [{**structural_scores(kind, pred, test), "dev_loss": -history["dev"][g],
             "epochs": history["epochs"]}
            for g, pred in enumerate(predictions(probe, test))]
