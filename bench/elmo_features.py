"""ELMo's claim (Peters et al. 2018, sec. 5): a task's scalar mix of the biLM's layers makes better
features than static word embeddings trained on the same corpus. Checked here on part-of-speech
tagging of the generated treebank (lmforge/data/treebank.py), whose grammar gives some words two
tags (plays, watch, that: NOUN/VERB, PRON/DET) that only the context tells apart.

1. Corpus: `--lm-sentences` treebank sentences (seed 1), written as text; the tagging data are other
   sentences of the same grammar (seed 0; no LM sentence is reused).
2. Static embeddings trained on the corpus, the same tokens and the same width as an ELMo layer
   (2 d_model): skip-gram with negative sampling (Mikolov et al. 2013: window 2, 5 negatives from
   unigram^0.75), epochs until the epoch's mean loss improves by less than --skipgram-tol.
3. An ELMo pretrained on the corpus with `bilm` (full softmax) through lmforge's one trainer:
   `--elmo small` is the published elmo-small (2x1024 LSTMs, 128-d projections, 2048 filters),
   `--elmo tiny` a 0.7M-parameter one for a CPU. Also reported: ELMo's layer 0 alone (the
   context-free character-CNN token layer, the paper's own baseline) and its softmax word embeddings.
4. One frozen-feature head per feature set (lmforge's Probe: linear, standardised features; the
   ELMo mix with ScalarMix over the 3 layers; and, as the paper uses ELMo (sec. 3.3: [x_k; ELMo_k]),
   the skip-gram vector joined to the mix), three head seeds; accuracy on the test words, on
   the test words the training data tag two ways, and on those in the corpus' vocabulary (the
   grammar invents proper names, some of which the corpus never shows: a static table has no
   vector of their own for them, ELMo's characters do).

Everything runs on --device (auto: cuda when there is one). --max-minutes bounds the whole run: a
short timed ELMo run (--calibration-steps) measures a step and trains the word vocabulary; the
skip-gram table and its probe follow (the probe's time sizes the reserve kept for the ELMo probes);
then ELMo trains for the steps that fit, so the learning-rate schedule ends where training does; a
deadline stops it early should it still run late (the JSON records the steps reached), and a feature
set still unscored when the time is up is marked skipped. The JSON is written after every stage.

    flock /tmp/lmforge-cpu.lock .venv/bin/python -m bench.elmo_features --elmo tiny --lm-sentences 20000 \
        --batch-size 32 --steps 400 --max-minutes 30       # a CPU
    PYTHONPATH=src python -m bench.elmo_features --device cuda --out $OUT     # a GPU: the defaults

Writes elmo_features.json under --out and prints a summary.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import machine
from lmforge.analysis.probe_fit import Examples, FitConfig, Probe, accuracy, fit, predict
from lmforge.data.treebank import treebank, treebank_splits
from lmforge.presets import get_config
from lmforge.tokenizer import load_tokenizer
from lmforge.train import TrainConfig
from lmforge.train.config import check_device
from lmforge.train.log import read_metrics
from lmforge.train.loop import resolve_device
from lmforge.train.pretrain import pretrain

# ELMo sizes as overrides of the elmo-small preset (d_model 128, lstm_dim 1024, 2048 filters, 1 highway)
SIZES = {"small": {}, "tiny": {"d_model": 64, "lstm_dim": 256, "n_highway": 1, "char_embed_dim": 16,
                               "char_filters": [[1, 32], [2, 32], [3, 64], [4, 64]]}}
# linear heads trained until the dev accuracy has not improved for 25 epochs: a char-CNN layer's
# word-identity-to-tag map converges slowly (at 40 epochs and patience 5, lr 3e-3, layer 0 of a
# 200-step ELMo scored 72 %, at lr 0.1 and 227 epochs 88 %; the skip-gram table 97.5 % either way)
HEAD = FitConfig(epochs=400, lr=0.1, mix_lr=0.03, batch_size=1024, patience=25)
SEEDS = (0, 1, 2)
START = time.perf_counter()


def say(line: str) -> None:
    """A progress line with the seconds since the start."""
    print(f"[{time.perf_counter() - START:6.1f}s] {line}", flush=True)


def left(args) -> float:
    """Seconds until --max-minutes have passed since the start."""
    return START + 60 * args.max_minutes - time.perf_counter()


class Deadline:
    """A Trainer evaluator that stops training once time.perf_counter() passes `end`."""

    def __init__(self, end: float) -> None:
        self.end = end

    def __call__(self, trainer) -> dict:
        return {"stop": True} if time.perf_counter() >= self.end else {}


def write_corpus(path: Path, n: int) -> list:
    """n treebank sentences (seed 1) as text, ten to a paragraph; returns them as word lists."""
    sentences = [r["words"] for r in treebank(n, seed=1)]
    blocks = [" ".join(" ".join(s) for s in sentences[i: i + 10]) for i in range(0, n, 10)]
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return sentences


def train_config(args, steps: int, **kw) -> TrainConfig:
    """The ELMo runs' training options (warm-up: 5 % of the steps)."""
    return TrainConfig(steps=steps, batch_size=args.batch_size, lr=args.lr, warmup=max(1, steps // 20), seed=0,
                       progress=False, save_every=0, device=args.device, **kw)


def run_elmo(args, corpus: Path, out: Path, train: TrainConfig, tokenizer=None, evaluator=None):
    """ELMo pretrained with bilm on the corpus: (model, its tokenizer, metrics rows, seconds)."""
    start = time.perf_counter()
    model = pretrain("bilm", out, train, preset="elmo-small", data=[str(corpus)], tokenizer=tokenizer,
                     overrides={**(SIZES[args.elmo] or {}), "vocab_size": args.vocab_size},
                     max_len=args.max_len, log=lambda *a: None, evaluator=evaluator)
    return model.eval(), load_tokenizer(out / "final"), read_metrics(out / "metrics.jsonl"), \
        time.perf_counter() - start


def calibrate(args, corpus: Path, work: Path) -> dict:
    """A short run of the same model and batches: seconds per step (steps after the first logged row,
    so start-up and first-call costs are left out), and the run's other seconds (tokenizer, examples,
    saving), which the real run pays too, bar the tokenizer it reuses."""
    k = args.calibration_steps
    model, tokenizer, rows, seconds = run_elmo(args, corpus, work / "calibration",
                                               train_config(args, k, log_every=max(1, k // 5)))
    first, last = rows[0], rows[-1]
    per_step = (last["elapsed_s"] - first["elapsed_s"]) / max(1, last["step"] - first["step"])
    return {"steps": k, "seconds": round(seconds, 2), "seconds_per_step": per_step,
            "other_seconds": max(0.0, seconds - last["elapsed_s"]), "tokenizer": tokenizer,
            "parameters": model.num_parameters()}


def train_elmo(args, corpus: Path, work: Path, cal: dict, reserve: float) -> tuple:
    """(model, tokenizer, JSON record): the steps that fit the time left less `reserve` (at most
    --steps), with a deadline that stops training should it still run late."""
    budget = left(args) - reserve - cal["other_seconds"]
    steps = max(1, min(args.steps, int(budget / (1.1 * cal["seconds_per_step"]))))
    say(f"ELMo: {1000 * cal['seconds_per_step']:.0f} ms/step, {budget:.0f} s to pretrain: {steps} steps")
    every = max(1, min(50, steps // 10))
    deadline = Deadline(time.perf_counter() + max(0.0, left(args) - reserve))
    train = train_config(args, steps, log_every=every, eval_every=every, eval_batches=4)
    model, tokenizer, rows, seconds = run_elmo(args, corpus, work / "elmo", train, cal["tokenizer"], deadline)
    evals = [r for r in rows if "eval_loss" in r]
    record = {"preset": "elmo-small", "overrides": SIZES[args.elmo], "sizes": elmo_sizes(model.config),
              "parameters": model.num_parameters(), "steps_planned": steps, "steps_reached": rows[-1]["step"],
              "stopped_by_deadline": rows[-1]["step"] < steps, "batch_size": args.batch_size, "lr": args.lr,
              "max_len": args.max_len, "first_logged": rows[0], "last_logged": rows[-1],
              "held_out": [{k: r[k] for k in r if k == "step" or k.startswith("eval_")} for r in evals],
              "pretrain_seconds": round(seconds, 1),
              "calibration": {k: v for k, v in cal.items() if k != "tokenizer"}}
    return model, tokenizer, record


def elmo_sizes(cfg) -> dict:
    """The model config's ELMo size fields."""
    names = ("d_model", "lstm_dim", "n_layers", "n_highway", "char_embed_dim", "char_filters", "dropout",
             "cell_clip", "proj_clip", "vocab_size")
    return {name: getattr(cfg, name) for name in names}


def pairs(ids: list, window: int) -> tuple:
    """(centre, context): every (word, neighbour within `window`) pair of the id sequences."""
    centre, context = [], []
    for s in ids:
        for off in range(1, window + 1):
            centre += [s[:-off], s[off:]]
            context += [s[off:], s[:-off]]
    return torch.cat(centre), torch.cat(context)


def skipgram(args, sentences: list, tokenizer, d: int, end: float, window: int = 2, k: int = 5,
             seed: int = 0) -> tuple:
    """(SGNS input vectors (V, d) on the device, per-epoch mean losses) over the corpus' word ids (the
    ELMo run's word tokenizer). The draws (initial vectors, order, negatives) are made on the CPU, so
    they do not depend on the device; epochs stop once one improves the mean loss by < --skipgram-tol,
    after --skipgram-epochs, or once time.perf_counter() passes `end`."""
    device = resolve_device(args.device)
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.tensor(tokenizer.encode(" ".join(s), add_special_tokens=False).ids) for s in sentences]
    centre, context = pairs(ids, window)  # (P,) each
    V = tokenizer.vocab_size
    noise = torch.bincount(torch.cat(ids), minlength=V).float() ** 0.75
    w_in = torch.nn.Parameter(((torch.rand(V, d, generator=gen) - 0.5) / d).to(device))
    w_out = torch.nn.Parameter(torch.zeros(V, d, device=device))
    opt = torch.optim.Adam([w_in, w_out], lr=3e-3)
    centre, context, losses = centre.to(device), context.to(device), []
    for _ in range(args.skipgram_epochs):
        total = torch.zeros((), device=device)
        batches = torch.randperm(len(centre), generator=gen).split(4096)
        for rows in batches:
            negatives = torch.multinomial(noise, len(rows) * k, True, generator=gen).to(device)
            rows = rows.to(device)
            c, o = w_in[centre[rows]], w_out[context[rows]]  # (B, d)
            neg = w_out[negatives].view(len(rows), k, d)
            loss = -F.logsigmoid((c * o).sum(-1)).mean() - F.logsigmoid(-(neg @ c[:, :, None])).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach()
        losses.append(total.item() / len(batches))
        if len(losses) > 1 and losses[-2] - losses[-1] < args.skipgram_tol * losses[-2] \
                or time.perf_counter() >= end:
            break
    return w_in.detach(), losses


def lookup(table: torch.Tensor, tokenizer, sentences: list) -> list:
    """Per sentence a (1, n, d) tensor of each word's static vector (the tokenizer's unknown id for a
    word it lacks: the grammar's names that the corpus never shows)."""
    unk = tokenizer.special_id("unk")
    out = []
    for words in sentences:
        ids = [tokenizer.token_to_id(w) if tokenizer.token_to_id(w) is not None else unk for w in words]
        out.append(table[torch.tensor(ids, device=table.device)][None])
    return out


def examples(features: list, records: list, index: dict) -> Examples:
    """Word examples: table (L, W, d), one label set of every word's tag (on the table's device)."""
    table = torch.cat(features, dim=1).float()
    if table.shape[1] != sum(len(r["upos"]) for r in records):
        raise ValueError(f"{table.shape[1]} feature vectors for {sum(len(r['upos']) for r in records)} words")
    labels = torch.tensor([[index[t] for r in records for t in r["upos"]]], device=table.device)
    return Examples(table, torch.arange(labels.shape[1], device=table.device)[:, None], labels)


def standardised(data: dict) -> dict:
    """Every split's table standardised by the training split's mean and sd per layer and dimension."""
    train = data["train"].table
    mean, std = train.mean(1, keepdim=True), train.std(1, keepdim=True).clamp(min=1e-6)
    return {k: Examples((e.table - mean) / std, e.index, e.labels) for k, e in data.items()}


def score_on_cpu(module, data) -> torch.Tensor:
    """fit's development score, as a CPU tensor (fit compares it with its CPU record of the best)."""
    return accuracy(module, data).cpu()


def evaluate(features: dict, splits: dict, known: torch.Tensor) -> dict:
    """Linear heads (scalar-mixed when several layers) on standardised frozen features: accuracy on all
    test words, on the words the training data tag two ways, and on the words in the corpus' vocabulary
    (`known`: the static tables have a vector of their own for them), per seed and mean."""
    tags_of = defaultdict(set)
    for r in splits["train"]:
        for w, t in zip(r["words"], r["upos"]):
            tags_of[w].add(t)
    labels = sorted({t for r in splits["train"] for t in r["upos"]})
    index = {t: i for i, t in enumerate(labels)}
    data = standardised({k: examples(features[k], splits[k], index) for k in splits})
    device = data["train"].table.device
    ambiguous = torch.tensor([len(tags_of[w]) > 1 for r in splits["test"] for w in r["words"]], device=device)
    known, runs = known.to(device), []
    for seed in SEEDS:
        L, _, d = data["train"].table.shape
        probe = Probe(d, len(labels), 1, "linear", n_mix=L).to(device)
        history = fit(probe, data["train"], data["dev"], HEAD, seed, score=score_on_cpu)
        right = predict(probe, data["test"])[0] == data["test"].labels[0]
        runs.append({"accuracy": right.float().mean().item(),
                     "ambiguous_accuracy": right[ambiguous].float().mean().item(),
                     "known_accuracy": right[known].float().mean().item(), "epochs": history["epochs"],
                     "mix_weights": probe.mix.weights.tolist() if probe.mix is not None else None})
    keys = ("accuracy", "ambiguous_accuracy", "known_accuracy")
    return {**{key: statistics.mean(r[key] for r in runs) for key in keys},
            "test_words": len(ambiguous), "ambiguous_words_in_test": int(ambiguous.sum()),
            "words_not_in_corpus_vocabulary": int((~known).sum()), "runs": runs}


def elmo_feature_sets(model, tokenizer, words: dict, static: dict) -> dict:
    """name -> split -> per sentence (L, n, d): the scalar mix's 3 layers, the skip-gram vectors joined to
    them, the top, layer 0, and the softmax's word embeddings, in the order they are scored."""
    layered = {k: model.word_layers(v, batch_size=128) for k, v in words.items()}  # (3, n, 2 d_model) each
    softmax = model.heads["softmax"].projection()[0].detach()  # (V, d_model): the shared output embeddings
    # the paper's use (sec. 3.3): [x_k; ELMo_k], the task's own word vector beside the mix. The static vector
    # is repeated on each layer: the mix's weights sum to 1, so it passes through the mix unchanged (x gamma)
    joined = {k: [torch.cat([f, x.to(f.device).expand(len(f), -1, -1)], dim=-1) for f, x in zip(v, static[k])]
              for k, v in layered.items()}
    return {"elmo_scalar_mix": layered, "static_skipgram_plus_elmo_mix": joined,
            "elmo_top_layer": {k: [f[2:] for f in v] for k, v in layered.items()},
            "elmo_layer0_char_cnn": {k: [f[:1] for f in v] for k, v in layered.items()},
            "static_elmo_softmax_embeddings": {k: lookup(softmax, tokenizer, v) for k, v in words.items()}}


def write(args, report: dict) -> None:
    """The report so far, as elmo_features.json under --out."""
    report["seconds"] = round(time.perf_counter() - START, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "elmo_features.json").write_text(json.dumps(report, indent=2) + "\n")


def summary(name: str, r: dict) -> str:
    """One result line."""
    return (f"{name:32s} accuracy {r['accuracy']:.4f}  ambiguous words {r['ambiguous_accuracy']:.4f}  "
            f"words in the vocabulary {r['known_accuracy']:.4f}")


def static_stage(args, report: dict, corpus: list, tokenizer, d: int, splits: dict, words: dict, known) -> tuple:
    """Skip-gram table and its probe into the report; returns (the probes' seconds per epoch, the
    skip-gram features: split -> per sentence (1, n, d))."""
    start = time.perf_counter()
    table, losses = skipgram(args, corpus, tokenizer, d, end=START + 0.15 * 60 * args.max_minutes)
    report["static_skipgram"] = {"dim": d, "window": 2, "negatives": 5, "epochs": len(losses),
                                 "epoch_losses": [round(x, 5) for x in losses], "tol": args.skipgram_tol,
                                 "seconds": round(time.perf_counter() - start, 1)}
    start, static = time.perf_counter(), {k: lookup(table, tokenizer, v) for k, v in words.items()}
    report["results"]["static_skipgram"] = evaluate(static, splits, known)
    say(summary("static_skipgram", report["results"]["static_skipgram"]) + f"  ({len(losses)} epochs)")
    write(args, report)
    epochs = sum(r["epochs"] for r in report["results"]["static_skipgram"]["runs"])
    return (time.perf_counter() - start) / epochs, static


def header(args, corpus: list, splits: dict) -> dict:
    """The report's description of the run: task, corpus, device, options, heads."""
    device = resolve_device(args.device)
    seen = Counter(w for s in corpus for w in s)
    sizes = ", ".join(str(len(v)) for v in splits.values())
    return {"task": f"UPOS tagging of the generated treebank (train/dev/test {sizes} sentences); heads: linear, "
                    f"{len(SEEDS)} seeds",
            "corpus": f"{args.lm_sentences} treebank sentences (seed 1), {sum(seen.values())} words, {len(seen)} types",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "machine": machine(), "torch": torch.__version__, "threads": args.threads,
            "max_minutes": args.max_minutes,
            "options": {k: v for k, v in vars(args).items() if k != "out"},
            "head": {k: getattr(HEAD, k) for k in ("epochs", "lr", "mix_lr", "batch_size", "patience")},
            "results": {}}


def run(args) -> dict:
    """Every stage in order, the JSON written after each."""
    work = Path(tempfile.mkdtemp(prefix="elmo-features-"))
    corpus = write_corpus(work / "corpus.txt", args.lm_sentences)
    splits = treebank_splits(args.tag_sentences, seed=0, held_out=0.15)
    words = {k: [r["words"] for r in v] for k, v in splits.items()}
    report = header(args, corpus, splits)
    say(f"{report['corpus']}; on {report['device']}")
    cal = calibrate(args, work / "corpus.txt", work)
    tokenizer = cal["tokenizer"]
    d = 2 * get_config("elmo-small", **SIZES[args.elmo]).d_model  # an ELMo layer's width
    known = torch.tensor([tokenizer.token_to_id(w) is not None for r in splits["test"] for w in r["words"]])
    epoch_s, static = static_stage(args, report, corpus, tokenizer, d, splits, words, known)
    # kept for what follows the pretraining: 5 feature sets x 3 seeds x ~200 epochs of a head (the ELMo
    # ones take longer than the skip-gram's; the mix reads 3 layers), the features, saving
    reserve = 5 * len(SEEDS) * 200 * 1.3 * epoch_s + 10 * cal["seconds_per_step"] + 10
    model, tokenizer, report["elmo"] = train_elmo(args, work / "corpus.txt", work, cal, reserve)
    last = report["elmo"]["last_logged"]
    say(f"ELMo: {report['elmo']['steps_reached']} steps, perplexities forward {last['forward_perplexity']:.1f} "
        f"backward {last['backward_perplexity']:.1f}; held out {report['elmo']['held_out'][-1:]}")
    write(args, report)
    for name, features in elmo_feature_sets(model, tokenizer, words, static).items():
        if left(args) < 0:
            report["results"][name] = {"skipped": "out of time (--max-minutes)"}
            say(f"{name}: skipped, out of time")
            continue
        report["results"][name] = evaluate(features, splits, known)
        say(summary(name, report["results"][name]))
        write(args, report)
    return report


def without_plots() -> None:
    """Where matplotlib is missing (a bare GPU machine), train without loss.png, saying so."""
    from lmforge.train import loop

    if importlib.util.find_spec("matplotlib") is None:
        say("matplotlib is not installed: no loss.png is drawn")
        loop.plot_losses = lambda *args, **kw: None


def parse(argv=None) -> argparse.Namespace:
    """The options, checked: a bad one is a one-line error naming it (exit 2)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda, cuda:N or cpu")
    p.add_argument("--elmo", choices=sorted(SIZES), default="small")
    p.add_argument("--max-minutes", type=float, default=5.5, help="the whole run's wall-clock bound")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--skipgram-tol", type=float, default=0.002)
    for name, default in (("lm-sentences", 50000), ("steps", 20000), ("batch-size", 128), ("max-len", 48),
                          ("vocab-size", 10000), ("calibration-steps", 30), ("skipgram-epochs", 40),
                          ("tag-sentences", 1200), ("threads", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    for name in ("lm_sentences", "steps", "batch_size", "vocab_size", "skipgram_epochs", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.calibration_steps < 2:
        p.error("--calibration-steps must be at least 2 (its per-step time is measured between logged steps)")
    if args.tag_sentences < 20:
        p.error("--tag-sentences must be at least 20 (train, dev and test need sentences)")
    if args.max_len < 3:
        p.error("--max-len must be at least 3 (<S>, a word, </S>)")
    for name in ("max_minutes", "lr", "skipgram_tol"):
        if not getattr(args, name) > 0 or not math.isfinite(getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} must be a positive number")
    try:
        check_device(args.device)
    except ValueError as err:
        p.error(f"--device: {err}")
    return args


def main() -> None:
    """Pretrain, build the feature sets, fit the heads, write the JSON."""
    args = parse()
    torch.set_num_threads(args.threads)
    without_plots()
    report = run(args)
    for name, r in report["results"].items():
        if "accuracy" in r:
            print(summary(name, r))
    print(f"wrote {Path(args.out) / 'elmo_features.json'} ({report['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
