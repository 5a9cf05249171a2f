"""ELMo's claim (Peters et al. 2018, sec. 5): a task's scalar mix of the biLM's layers makes better
features than static word embeddings trained on the same corpus. Checked here on part-of-speech
tagging of the generated treebank (lmforge/data/treebank.py), whose grammar gives some words two
tags (plays, watch, that: NOUN/VERB, PRON/DET) that only the context tells apart.

1. Corpus: `--lm-sentences` treebank sentences (seed 1), written as text; the tagging data are other
   sentences of the same grammar (seed 0; no LM sentence is reused).
2. A small ELMo pretrained on the corpus with `bilm` (full softmax) through lmforge's one trainer.
3. Static embeddings trained on the same corpus, the same tokens and the same width as an ELMo
   layer (2 d_model): skip-gram with negative sampling (Mikolov et al. 2013: window 2, 5 negatives
   from unigram^0.75). Also reported: ELMo's layer 0 alone (the context-free character-CNN token
   layer, the paper's own baseline) and ELMo's softmax word embeddings (d_model wide).
4. One frozen-feature head per feature set (lmforge's Probe: linear, standardised features; the
   ELMo mix with ScalarMix over the 3 layers), three head seeds; accuracy on the test words, on
   the test words the training data tag two ways, and on those in the corpus' vocabulary (the
   grammar invents proper names, some of which the corpus never shows: a static table has no
   vector of their own for them, ELMo's characters do).

    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/elmo_features.py [--steps 300] [--out bench/results]

Writes elmo_features.json under --out and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.analysis.probe_fit import Examples, FitConfig, Probe, fit, predict
from lmforge.data.treebank import treebank, treebank_splits
from lmforge.tokenizer import load_tokenizer
from lmforge.train import TrainConfig
from lmforge.train.log import read_metrics
from lmforge.train.pretrain import pretrain

ELMO_SIZE = dict(d_model=64, lstm_dim=256, n_highway=1, char_embed_dim=16,
                 char_filters=[[1, 32], [2, 32], [3, 64], [4, 64]], dropout=0.1)
HEAD = FitConfig(epochs=40, lr=3e-3, batch_size=256, patience=5)


def write_corpus(path: Path, n: int) -> list:
    """n treebank sentences (seed 1) as text, ten to a paragraph; returns them as word lists."""
    sentences = [r["words"] for r in treebank(n, seed=1)]
    blocks = [" ".join(" ".join(s) for s in sentences[i: i + 10]) for i in range(0, n, 10)]
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return sentences


def train_elmo(corpus: Path, out: Path, steps: int):
    """ELMo pretrained with bilm on the corpus: (model, tokenizer, metrics rows)."""
    train = TrainConfig(steps=steps, batch_size=32, lr=2e-3, warmup=max(1, steps // 20), seed=0, progress=False,
                        log_every=max(1, steps // 10), save_every=0)
    model = pretrain("elmo-small", "bilm", out, train, files=[str(corpus)], vocab_size=5000,
                     overrides=ELMO_SIZE, max_len=24, log=lambda *a: None)
    return model.eval(), load_tokenizer(out / "final"), read_metrics(out / "metrics.jsonl")


def skipgram(sentences: list, tokenizer, d: int, epochs: int = 5, window: int = 2, k: int = 5, seed: int = 0):
    """SGNS input vectors (V, d) over the corpus' word ids (the ELMo run's word tokenizer)."""
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.tensor(tokenizer.encode(" ".join(s), add_special_tokens=False).ids) for s in sentences]
    centre, context = [], []
    for s in ids:
        for off in range(1, window + 1):
            centre += [s[:-off], s[off:]]
            context += [s[off:], s[:-off]]
    centre, context = torch.cat(centre), torch.cat(context)  # (P,) every (word, neighbour) pair
    V = tokenizer.vocab_size
    noise = torch.bincount(torch.cat(ids), minlength=V).float() ** 0.75
    w_in = torch.nn.Parameter((torch.rand(V, d, generator=gen) - 0.5) / d)
    w_out = torch.nn.Parameter(torch.zeros(V, d))
    opt = torch.optim.Adam([w_in, w_out], lr=3e-3)
    for _ in range(epochs):
        for rows in torch.randperm(len(centre), generator=gen).split(4096):
            c, o = w_in[centre[rows]], w_out[context[rows]]  # (B, d)
            neg = w_out[torch.multinomial(noise, len(rows) * k, True, generator=gen)].view(len(rows), k, d)
            loss = -F.logsigmoid((c * o).sum(-1)).mean() - F.logsigmoid(-(neg @ c[:, :, None])).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w_in.detach()


def lookup(table: torch.Tensor, tokenizer, sentences: list) -> list:
    """Per sentence a (1, n, d) tensor of each word's static vector (the tokenizer's unknown id for a
    word it splits or lacks: none in this corpus' vocabulary)."""
    unk = tokenizer.special_id("unk")
    out = []
    for words in sentences:
        ids = [tokenizer.token_to_id(w) if tokenizer.token_to_id(w) is not None else unk for w in words]
        out.append(table[torch.tensor(ids)][None])
    return out


def examples(features: list, records: list, index: dict) -> Examples:
    """Word examples: table (L, W, d), one label set of every word's tag."""
    table = torch.cat(features, dim=1)
    labels = torch.tensor([[index[t] for r in records for t in r["upos"]]])
    return Examples(table, torch.arange(labels.shape[1])[:, None], labels)


def evaluate(features: dict, splits: dict, known: torch.Tensor, seeds=(0, 1, 2)) -> dict:
    """Linear heads (scalar-mixed when several layers) on standardised frozen features: accuracy on all
    test words, on the words the training data tag two ways, and on the words in the corpus' vocabulary
    (`known`: the static tables have a vector of their own for them), per seed and mean."""
    tags_of = defaultdict(set)
    for r in splits["train"]:
        for w, t in zip(r["words"], r["upos"]):
            tags_of[w].add(t)
    labels = sorted({t for r in splits["train"] for t in r["upos"]})
    index = {t: i for i, t in enumerate(labels)}
    data = {k: examples(features[k], splits[k], index) for k in splits}
    mean, std = data["train"].table.mean(1, keepdim=True), data["train"].table.std(1, keepdim=True).clamp(min=1e-6)
    data = {k: Examples((e.table - mean) / std, e.index, e.labels) for k, e in data.items()}
    ambiguous = torch.tensor([len(tags_of[w]) > 1 for r in splits["test"] for w in r["words"]])
    runs = []
    for seed in seeds:
        probe = Probe(data["train"].table.shape[-1], len(labels), 1, "linear", n_mix=data["train"].table.shape[0])
        fit(probe, data["train"], data["dev"], HEAD, seed)
        right = predict(probe, data["test"])[0] == data["test"].labels[0]
        runs.append({"accuracy": right.float().mean().item(),
                     "ambiguous_accuracy": right[ambiguous].float().mean().item(),
                     "known_accuracy": right[known].float().mean().item(),
                     "mix_weights": probe.mix.weights.tolist() if probe.mix is not None else None})
    keys = ("accuracy", "ambiguous_accuracy", "known_accuracy")
    return {**{key: statistics.mean(r[key] for r in runs) for key in keys},
            "test_words": len(ambiguous), "ambiguous_words_in_test": int(ambiguous.sum()),
            "words_not_in_corpus_vocabulary": int((~known).sum()), "runs": runs}


def main() -> None:
    """Pretrain, build the feature sets, fit the heads, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--lm-sentences", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tag-sentences", type=int, default=1200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="elmo-features-"))
    corpus = write_corpus(work / "corpus.txt", args.lm_sentences)
    model, tokenizer, metrics = train_elmo(work / "corpus.txt", work / "elmo", args.steps)
    pretrain_s = time.perf_counter() - start
    splits = treebank_splits(args.tag_sentences, seed=0, held_out=0.15)
    words = {k: [r["words"] for r in v] for k, v in splits.items()}
    layered = {k: model.word_layers(v) for k, v in words.items()}  # (3, n, 2 d_model) per sentence
    d = 2 * model.config.d_model
    static = skipgram(corpus, tokenizer, d)
    softmax = model.heads["softmax"].projection()[0].detach()  # (V, d_model): the shared output embeddings
    feature_sets = {
        "elmo_scalar_mix": layered,
        "elmo_top_layer": {k: [f[2:] for f in v] for k, v in layered.items()},
        "elmo_layer0_char_cnn": {k: [f[:1] for f in v] for k, v in layered.items()},
        "static_skipgram": {k: lookup(static, tokenizer, v) for k, v in words.items()},
        "static_elmo_softmax_embeddings": {k: lookup(softmax, tokenizer, v) for k, v in words.items()},
    }
    known = torch.tensor([tokenizer.token_to_id(w) is not None for r in splits["test"] for w in r["words"]])
    results = {name: evaluate(f, splits, known) for name, f in feature_sets.items()}
    seen = Counter(w for s in corpus for w in s)
    report = {
        "task": "UPOS tagging of the generated treebank (train/dev/test "
                f"{', '.join(str(len(v)) for v in splits.values())} sentences); heads: linear, 3 seeds",
        "corpus": f"{args.lm_sentences} treebank sentences (seed 1), {sum(seen.values())} words, {len(seen)} types",
        "elmo": {**ELMO_SIZE, "parameters": model.num_parameters(), "steps": args.steps, "batch_size": 32,
                 "first_logged": metrics[0], "last_logged": metrics[-1], "pretrain_seconds": round(pretrain_s, 1)},
        "static_skipgram": {"dim": d, "window": 2, "negatives": 5, "epochs": 5},
        "results": results, "seconds": round(time.perf_counter() - start, 1), "threads": args.threads,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "elmo_features.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, r in results.items():
        print(f"{name:32s} accuracy {r['accuracy']:.4f}  ambiguous words {r['ambiguous_accuracy']:.4f}  "
              f"words in the vocabulary {r['known_accuracy']:.4f}")
    print(f"wrote {out / 'elmo_features.json'} ({report['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
