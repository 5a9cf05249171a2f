"""The QA table, one seeded run, on the dictionary questions (lmforge.retrieval.dictionary_qa:
definitions restated with other entries' words, 10,000 entries as passages, 500 held-out questions)
or, with `export --questions builtin`, the built-in corpus's (184 passages; questions about held-out
people and cities, asked in other words than the passage states them):

- retrieval: recall@1/5/20 of BM25, all-MiniLM-L6-v2 untrained, and DPR-trained from it (in-batch
  + one BM25 hard negative per question);
- reader: the extractive reader (from all-MiniLM-L6-v2) over the trained retriever's top k,
  exact match;
- RAG: a small BART (random init; the retriever's WordPiece vocabulary, or its own of --generator-vocab
  pieces; or --generator DIR, a pretrained one with its own tokenizer) trained for the same steps
  with the same seed reading the trained retriever's top k (RAG-Token, its question encoder trained
  too at a 20x lower learning rate, the passage index fixed) and closed-book (k = 0); exact match.

--budget S stops each training stage early (a share of the time left) so the run ends within
about S seconds; the steps each stage took are in the JSON, which is written after every stage.
The closed-book generator trains for the steps the RAG run took. --stages picks the stages
(retrieval, reader, rag; comma-separated) and --retriever DIR reads a trained question encoder
(work/dpr/final of an earlier run) instead of training one, for rag alone. --passages / --train-questions /
--test-questions take a subset (a dry run); --model may be an fp16 copy of the checkpoint (its
weights are read into fp32).

    .venv/bin/python -m bench.retrieval_qa export --out runs/qa-data [--questions builtin]  # passages + questions
    .venv/bin/python -m bench.retrieval_qa run --data runs/qa-data --model all-MiniLM-L6-v2 \\
        --work runs/qa --out runs/qa/result.json [--device cuda] [--budget 380]
    .venv/bin/python -m bench.retrieval_qa merge --out runs/qa/result.json   # into results/retrieval.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import lmforge
from bench.common import machine
from lmforge.retrieval.bm25 import BM25Index, hard_negatives
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder, DPRObjective, passage_text, training_examples
from lmforge.retrieval.evaluate import bm25_rankings, compare, dense_rankings, recall_at_k
from lmforge.retrieval.index import DenseIndex
from lmforge.data.world import World
from lmforge.retrieval.passages import builtin_documents, passages_from_documents, read_passages, write_passages
from lmforge.retrieval.questions import builtin_questions
from lmforge.retrieval.rag_train import RAGObjective, exact_match_rate, passage_tokens, rag_examples
from lmforge.retrieval.reader import ExtractiveReader, reader_exact_match, reader_examples
from lmforge.train import TrainConfig
from lmforge.train.loop import Trainer, resolve_device

GENERATOR = {"n_layers": 3, "n_decoder_layers": 3, "d_model": 256, "n_heads": 4, "d_ff": 1024, "max_seq_len": 128,
             "dropout": 0.1}
RESULTS = Path(__file__).parent / "results" / "retrieval.json"
# of the budget's time left at a stage's start: RAG leaves the closed-book run (about 0.6 of its step
# time) room for as many steps
SHARES = {"dpr": 0.25, "reader": 0.2, "rag": 0.55, "closed_book": 0.85}
START = time.perf_counter()
STAGES = ("retrieval", "reader", "rag")


def say(line: str) -> None:
    """One progress line, with the seconds since the start."""
    print(f"[{time.perf_counter() - START:7.1f}s] {line}", flush=True)


class Deadline:
    """A Trainer evaluator that stops training once the clock passes `end` or `max_steps` are
    done (None: never)."""

    def __init__(self, end: float | None, max_steps: int | None = None) -> None:
        self.end, self.max_steps = end, max_steps

    def __call__(self, trainer) -> dict:
        late = self.end is not None and time.perf_counter() >= self.end
        return {"stop": True} if late or (self.max_steps is not None and trainer.step >= self.max_steps) else {}


def _without_plots() -> None:
    """Where matplotlib is missing (a bare GPU machine), train without loss.png, saying so."""
    import importlib.util

    from lmforge.train import loop

    if importlib.util.find_spec("matplotlib") is None:
        say("matplotlib is not installed: no loss.png is drawn")
        loop.plot_losses = lambda *args, **kw: None


DATA = {"gcide": "dictionary_qa (GCIDE)", "builtin": "builtin_qa (the built-in corpus; test = dev + test questions)"}


def export(out: Path, seed: int = 0, questions: str = "gcide", people: int = 120) -> None:
    """The questions' passages and train / test records as JSONL under `out`: the dictionary's, or the
    built-in corpus's (its dev questions join the test set: 10 % of the entities are too few alone),
    drawn from a World of `people` people (120: the built-in corpus itself) and a fifth as many cities."""
    if questions == "gcide":
        passages, sets = dictionary_questions(seed=seed)
    else:
        world, passages = world_passages(seed, people)
        split = builtin_questions(passages, seed, world)
        sets = {"train": split["train"], "test": split["dev"] + split["test"]}
    write_passages(passages, out / "passages.jsonl")
    (out / "source.json").write_text(json.dumps({"data": DATA[questions]}) + "\n")
    for name, records in sets.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def world_passages(seed: int, people: int) -> tuple:
    """(World, its passages): the built-in corpus drawn from a World of `people` people and a fifth as
    many cities (at least 24)."""
    world = World(seed, n_people=people, n_cities=max(24, people // 5), n_products=40)
    return world, passages_from_documents(builtin_documents(seed, world))


def _records(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def subset(passages: list, sets: dict, n_passages: int, n_train: int, n_test: int) -> tuple:
    """The first n_train / n_test questions and n_passages passages (their positives first, then
    the others in order); 0 keeps all."""
    sets = {"train": sets["train"][:n_train or None], "test": sets["test"][:n_test or None]}
    if not n_passages:
        return passages, sets
    wanted = {pid for r in sets["train"] + sets["test"] for pid in r["positives"]}
    if len(wanted) > n_passages:
        raise ValueError(f"--passages {n_passages} is fewer than the {len(wanted)} positives of the questions kept")
    chosen = [p for p in passages if p.id in wanted]
    chosen += [p for p in passages if p.id not in wanted][:n_passages - len(chosen)]
    return chosen, sets


def _cfg(args, steps: int, **kw) -> TrainConfig:
    return TrainConfig(steps=steps, seed=0, progress=False, log_every=50, eval_every=5, device=args.device, **kw)


def _deadline(args, stage: str, max_steps: int | None = None) -> Deadline:
    """The stage's share of the budget's time left (no deadline without a budget)."""
    if not args.budget:
        return Deadline(None, max_steps)
    now = time.perf_counter()
    return Deadline(now + SHARES[stage] * max(0.0, START + args.budget - now), max_steps)


def _fit(args, objective, examples, cfg: TrainConfig, out: Path, stage: str, max_steps: int | None = None,
         **kw) -> int:
    """Train with the stage's deadline (and at most max_steps of cfg's schedule); the steps taken."""
    trainer = Trainer(objective, examples, cfg, out, evaluator=_deadline(args, stage, max_steps), **kw)
    start = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - start
    say(f"{stage}: {trainer.step}/{cfg.steps} steps in {seconds:.1f}s ({1000 * seconds / max(1, trainer.step):.0f} ms/step)")
    return trainer.step


def retrieval(args, passages, sets) -> tuple:
    """(recall table, the trained encoder): BM25, untrained, and DPR-trained on the training
    questions (in-batch + one BM25 hard negative each; as evaluate.train_dpr, with the deadline)."""
    untrained = BiEncoder.from_dir(args.model, max_length=64)
    trained = BiEncoder.from_dir(args.model, max_length=64)
    bm25 = BM25Index.build(passages)
    examples = training_examples(trained, sets["train"], passages, hard_negatives(bm25, sets["train"], passages, 1))
    say(f"dpr: {len(examples)} training questions")
    steps = _fit(args, DPRObjective(trained), examples, _cfg(args, args.dpr_steps, batch_size=32, lr=3e-5, warmup=20),
                 args.work / "dpr", "dpr")
    trained.save(args.work / "dpr" / "final")
    untrained.model.to(next(trained.model.parameters()).device)
    table = compare(passages, sets["test"], {"untrained": untrained, "trained": trained}, args.work / "eval")
    return {"dpr_steps": args.dpr_steps, "dpr_steps_taken": steps, "batch_size": 32, **table}, trained


def reader(args, passages, sets, trained) -> dict:
    """The extractive reader's exact match over the trained retriever's top k (and BM25's)."""
    model = ExtractiveReader.from_dir(args.model, max_len=128)
    bm25 = BM25Index.build(passages)
    examples = reader_examples(model, sets["train"], passages, bm25_rankings(bm25, passages, sets["train"], 20), 3)
    say(f"reader: {len(examples)} training groups")
    steps = _fit(args, model, examples, _cfg(args, args.reader_steps, batch_size=16, lr=5e-5, warmup=30),
                 args.work / "reader", "reader")
    index = DenseIndex.load(args.work / "eval" / "index-trained")
    out = {"train_groups": len(examples), "negatives": 3, "steps": args.reader_steps, "steps_taken": steps}
    for name, ranked in (("dense", dense_rankings(trained, index, sets["test"], 20)),
                         ("bm25", bm25_rankings(bm25, passages, sets["test"], 20))):
        for k in (5, 20):
            out[f"{name} top-{k}"] = {"exact_match": round(reader_exact_match(model, sets["test"], passages, ranked, k), 4),
                                      **recall_at_k(ranked, sets["test"], (1, k))}
    return out


def rag_run(args, passages, sets, k: int, stage: str, max_steps: int | None = None) -> dict:
    """A fresh generator (and a fresh copy of the trained question encoder) with k passages, trained
    on args.rag_steps' schedule (stopped at max_steps, if given); test EM."""
    retriever = BiEncoder.from_dir(args.retriever or args.work / "dpr" / "final")
    retriever.model.to(resolve_device(args.device))
    vectors = retriever.encode([passage_text(p) for p in passages], batch_size=256, passage=True)
    generator, tok = make_generator(args, passages, sets["train"], retriever)
    objective = RAGObjective(generator, retriever, vectors, passage_tokens(retriever, passages, tok), k=k, max_len=96,
                             tokenizer=tok)
    start = time.perf_counter()
    taken = _fit(args, objective, rag_examples(retriever, sets["train"], tok),
                 _cfg(args, args.rag_steps, batch_size=args.rag_batch, lr=args.rag_lr, warmup=min(100, args.rag_steps // 10)),
                 args.work / f"rag-k{k}", stage, max_steps, lr_scale=lambda name, _: 0.05 if name.startswith("question_encoder.") else 1.0)
    train_s = time.perf_counter() - start
    return {"k": k, "steps_taken": taken, "train_s": round(train_s, 1),
            "exact_match": round(exact_match_rate(objective, sets["test"], batch_size=64, max_new_tokens=8), 4)}


def make_generator(args, passages: list, train: list, retriever) -> tuple:
    """(generator, its tokenizer): the pretrained one of --generator DIR (read afresh for each run), or a
    random-init small BART (seed 0) over --generator-vocab's tokenizer or the retriever's."""
    if args.generator is not None:
        return lmforge.load(args.generator), lmforge.load_tokenizer(args.generator)
    tok = generator_tokenizer(args, passages, train) or retriever.tokenizer
    torch.manual_seed(0)
    generator = lmforge.build("bart-base", vocab_size=tok.vocab_size, decoder_start_token_id=tok.special_id("cls"),
                              pad_token_id=tok.special_id("pad"), **GENERATOR)
    return generator, tok


def generator_tokenizer(args, passages: list, train: list):
    """With --generator-vocab N, a WordPiece tokenizer of N pieces trained on the passages and the
    training questions and answers (the generator's own, as RAG's BART beside DPR's BERT); else None."""
    if not args.generator_vocab:
        return None
    from lmforge.tokenizer.train import train_tokenizer

    return train_tokenizer(generator_texts(passages, train), "wordpiece", args.generator_vocab)


def generator_texts(passages: list, train: list) -> list:
    """What a generator's own vocabulary is trained on: the passages, then each training question
    with its answers."""
    return [passage_text(p) for p in passages] + [r["question"] + " " + " ".join(r["answers"]) for r in train]


def _write(args, result: dict) -> None:
    result["elapsed_s"] = round(time.perf_counter() - START, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def run(args) -> dict:
    """Every stage, in order; the JSON written after each."""
    passages = read_passages(args.data / "passages.jsonl")
    sets = {n: _records(args.data / f"{n}.jsonl") for n in ("train", "test")}
    passages, sets = subset(passages, sets, args.passages, args.train_questions, args.test_questions)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    source = args.data / "source.json"
    data = json.loads(source.read_text())["data"] if source.is_file() else DATA["gcide"]
    result = {"data": data, "passages": len(passages), "train": len(sets["train"]),
              "test": len(sets["test"]), "model": str(args.model),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "tf32": device.type == "cuda", "budget_s": args.budget, "machine": machine()}
    say(f"{result['passages']} passages, {result['train']} train / {result['test']} test questions on {result['device']}")
    if "retrieval" in args.stages:
        result["recall"], trained = retrieval(args, passages, sets)
        _write(args, result)
        say(f"recall: {json.dumps({n: r for n, r in result['recall'].items() if isinstance(r, dict)})}")
    if "reader" in args.stages:
        result["reader"] = reader(args, passages, sets, trained)
        _write(args, result)
        say(f"reader: {json.dumps(result['reader'])}")
    if "rag" in args.stages:
        rag(args, passages, sets, result)
    return result


def rag(args, passages, sets, result: dict) -> None:
    """RAG with args.rag_k passages, then closed book for the steps RAG took, into result["rag"]."""
    result["rag"] = {"kind": "token", "steps": args.rag_steps, "batch_size": args.rag_batch, "lr": args.rag_lr,
                     "generator": (str(args.generator) if args.generator is not None
                                   else {"preset": "bart-base", **GENERATOR}),
                     "generator_vocab": ("the pretrained generator's" if args.generator is not None
                                         else args.generator_vocab or "the retriever's"),
                     "retriever": str(args.retriever or args.work / "dpr" / "final"),
                     "input": "cls passage sep question sep in the generator tokenizer's tokens ([CLS] / [SEP]; "
                              "roberta family: <s> / </s>); closed book: cls question sep",
                     "exact_match": "greedy answer = a gold answer's tokens or its SQuAD-normalised text"}
    result["rag"]["rag"] = rag_run(args, passages, sets, args.rag_k, "rag")
    _write(args, result)
    say(f"rag: {json.dumps(result['rag']['rag'])}")
    result["rag"]["closed_book"] = rag_run(args, passages, sets, 0, "closed_book", result["rag"]["rag"]["steps_taken"])
    _write(args, result)
    say(f"closed book: {json.dumps(result['rag']['closed_book'])}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", choices=("export", "run", "merge"))
    p.add_argument("--data", type=Path)
    p.add_argument("--questions", choices=tuple(DATA), default="gcide", help="export: which questions")
    p.add_argument("--people", type=int, default=120, help="export --questions builtin: people in the World")
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--work", type=Path, default=Path("runs/qa"))
    p.add_argument("--out", type=Path, required=True)
    for name, default in (("dpr-steps", 600), ("reader-steps", 300), ("rag-steps", 3000), ("rag-k", 3),
                          ("rag-batch", 32)):
        p.add_argument(f"--{name}", type=int, default=default)
    for name in ("passages", "train-questions", "test-questions"):
        p.add_argument(f"--{name}", type=int, default=0, help="a subset of this many (0: all)")
    p.add_argument("--generator-vocab", type=int, default=0,
                   help="the generator's own WordPiece vocabulary of this size (0: the retriever's)")
    p.add_argument("--generator", type=Path,
                   help="a pretrained encoder-decoder directory with its tokenizer (e.g. lmforge pretrain "
                        "--objective denoising); default: a random-init small BART")
    p.add_argument("--rag-lr", type=float, default=5e-4, help="the generator's peak learning rate")
    p.add_argument("--budget", type=float, default=0, help="seconds the run should fit in (0: no limit)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    p.add_argument("--retriever", type=Path, help="a trained question encoder's directory (rag without retrieval)")
    p.add_argument("--device", default="auto")
    return p


def main() -> None:
    """export, run, or merge."""
    p = _parser()
    args = p.parse_args()
    for name in ("dpr_steps", "reader_steps", "rag_steps", "rag_k", "rag_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.rag_lr <= 0:
        p.error("--rag-lr must be positive")
    for name in ("passages", "train_questions", "test_questions", "budget", "generator_vocab"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    if args.generator is not None and args.generator_vocab:
        p.error("--generator brings its own tokenizer: not with --generator-vocab")
    if args.generator is not None and not (args.generator / "config.json").is_file():
        p.error(f"--generator {args.generator}: no config.json there (a model directory is expected)")
    stages = args.stages.split(",")
    wrong = [name for name in stages if name not in STAGES]
    if wrong or not stages:
        p.error(f"--stages: {', '.join(wrong) or 'none'} not of {', '.join(STAGES)}")
    if "reader" in stages and "retrieval" not in stages:
        p.error("--stages: reader needs retrieval (the trained retriever's index) in the same run")
    if "rag" in stages and "retrieval" not in stages and args.retriever is None:
        p.error("--stages: rag without retrieval needs --retriever DIR (a trained question encoder)")
    if args.retriever is not None and "retrieval" in stages:
        p.error("--retriever: only without the retrieval stage (which trains one)")
    if args.retriever is not None and not args.retriever.is_dir():
        p.error(f"--retriever: {args.retriever} is not a directory")
    args.stages = stages
    if args.job == "export":
        return export(args.out, questions=args.questions, people=args.people)
    if args.job == "merge":
        results, merged = json.loads(RESULTS.read_text()), json.loads(args.out.read_text())
        results["builtin_qa" if merged["data"].startswith("builtin") else "dictionary_qa"] = merged
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        return None
    if args.data is None:
        p.error("run needs --data (the folder `export` wrote)")
    args.work.mkdir(parents=True, exist_ok=True)
    _without_plots()
    try:
        print(json.dumps(run(args), indent=2))
    except ValueError as err:  # bad data or options (--passages too few, a damaged file): one line
        p.exit(2, f"retrieval_qa: {err}\n")


if __name__ == "__main__":
    main()
