"""The dictionary questions' table (lmforge.retrieval.dictionary_qa: definitions restated with
other entries' words, 10,000 entries as passages, 500 held-out questions), one seeded run:

- retrieval: recall@1/5/20 of BM25, all-MiniLM-L6-v2 untrained, and DPR-trained from it (in-batch
  + one BM25 hard negative per question);
- reader: the extractive reader (from all-MiniLM-L6-v2) over the trained retriever's top k,
  exact match;
- RAG: a small BART (random init, the retriever's WordPiece vocabulary) trained for the same steps
  with the same seed reading the trained retriever's top k (RAG-Token, its question encoder trained
  too at a 20x lower learning rate, the passage index fixed) and closed-book (k = 0); exact match.

    .venv/bin/python bench/retrieval_qa.py export --out runs/qa-data     # passages + questions JSONL
    .venv/bin/python bench/retrieval_qa.py run --data runs/qa-data --model all-MiniLM-L6-v2 \\
        --work runs/qa --out runs/qa/result.json [--device cuda]
    .venv/bin/python bench/retrieval_qa.py merge --out runs/qa/result.json   # into results/retrieval.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import lmforge
from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder, passage_text
from lmforge.retrieval.evaluate import bm25_rankings, compare, dense_rankings, recall_at_k, train_dpr
from lmforge.retrieval.index import DenseIndex
from lmforge.retrieval.passages import read_passages, write_passages
from lmforge.retrieval.rag_train import RAGObjective, exact_match_rate, passage_tokens, rag_examples
from lmforge.retrieval.reader import ExtractiveReader, reader_exact_match, reader_examples
from lmforge.train import TrainConfig
from lmforge.train.loop import Trainer

GENERATOR = dict(n_layers=3, n_decoder_layers=3, d_model=256, n_heads=4, d_ff=1024, max_seq_len=128, dropout=0.1)
RESULTS = Path(__file__).parent / "results" / "retrieval.json"


def export(out: Path, seed: int = 0) -> None:
    """The dictionary questions' passages and train / test records as JSONL under `out`."""
    passages, sets = dictionary_questions(seed=seed)
    write_passages(passages, out / "passages.jsonl")
    for name, records in sets.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _records(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cfg(args, steps: int, **kw) -> TrainConfig:
    return TrainConfig(steps=steps, seed=0, progress=False, log_every=50, device=args.device, **kw)


def retrieval(args, passages, sets) -> tuple:
    """(recall table, the trained encoder): BM25, untrained, trained on the test questions."""
    untrained = BiEncoder.from_dir(args.model, max_length=64)
    cfg = _cfg(args, args.dpr_steps, batch_size=32, lr=3e-5, warmup=20)
    trained = train_dpr(BiEncoder.from_dir(args.model, max_length=64), sets["train"], passages,
                        args.work / "dpr", cfg, n_hard=1)
    untrained.model.to(next(trained.model.parameters()).device)
    table = compare(passages, sets["test"], {"untrained": untrained, "trained": trained}, args.work / "eval")
    return table, trained


def reader(args, passages, sets, trained) -> dict:
    """The extractive reader's exact match over the trained retriever's top k (and BM25's)."""
    model = ExtractiveReader.from_dir(args.model, max_len=128)
    bm25 = BM25Index.build(passages)
    examples = reader_examples(model, sets["train"], passages, bm25_rankings(bm25, passages, sets["train"], 20), 3)
    Trainer(model, examples, _cfg(args, args.reader_steps, batch_size=16, lr=5e-5, warmup=30),
            args.work / "reader").fit()
    index = DenseIndex.load(args.work / "eval" / "index-trained")
    out = {"train_groups": len(examples), "negatives": 3, "steps": args.reader_steps}
    for name, ranked in (("dense", dense_rankings(trained, index, sets["test"], 20)),
                         ("bm25", bm25_rankings(bm25, passages, sets["test"], 20))):
        for k in (5, 20):
            out[f"{name} top-{k}"] = {"exact_match": round(reader_exact_match(model, sets["test"], passages, ranked, k), 4),
                                      **recall_at_k(ranked, sets["test"], (1, k))}
    return out


def rag_run(args, passages, train, test, retriever_dir, k: int) -> dict:
    """A fresh generator (and a fresh copy of the trained question encoder) with k passages; test EM."""
    retriever = BiEncoder.from_dir(retriever_dir)
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    retriever.model.to(device)
    vectors = retriever.encode([passage_text(p) for p in passages], batch_size=256, passage=True)
    tok = retriever.tokenizer
    torch.manual_seed(0)
    generator = lmforge.build("bart-base", vocab_size=tok.vocab_size, decoder_start_token_id=tok.special_id("cls"),
                              pad_token_id=tok.special_id("pad"), **GENERATOR)
    objective = RAGObjective(generator, retriever, vectors, passage_tokens(retriever, passages), k=k, max_len=96)
    start = time.perf_counter()
    Trainer(objective, rag_examples(retriever, train), _cfg(args, args.rag_steps, batch_size=32, lr=5e-4, warmup=100),
            args.work / f"rag-k{k}", lr_scale=lambda name, _: 0.05 if name.startswith("question_encoder.") else 1.0).fit()
    return {"exact_match": round(exact_match_rate(objective, test, batch_size=64, max_new_tokens=8), 4),
            "train_s": round(time.perf_counter() - start, 1)}


def run(args) -> dict:
    """Every stage, in order; the JSON written after each."""
    passages = read_passages(args.data / "passages.jsonl")
    sets = {n: _records(args.data / f"{n}.jsonl") for n in ("train", "test")}
    device = torch.cuda.get_device_name() if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    result = {"data": "dictionary_qa (GCIDE)", "passages": len(passages), "train": len(sets["train"]),
              "test": len(sets["test"]), "model": str(args.model), "device": device}
    table, trained = retrieval(args, passages, sets)
    result["recall"] = {"dpr_steps": args.dpr_steps, "batch_size": 32, **table}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    result["reader"] = reader(args, passages, sets, trained)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    result["rag"] = {"k": args.rag_k, "kind": "token", "steps": args.rag_steps, "batch_size": 32,
                     "generator": {"preset": "bart-base", **GENERATOR}}
    for name, k in (("rag", args.rag_k), ("closed_book", 0)):
        result["rag"][name] = rag_run(args, passages, sets["train"], sets["test"], args.work / "dpr" / "final", k)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    """export, run, or merge."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", choices=("export", "run", "merge"))
    p.add_argument("--data", type=Path)
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--work", type=Path, default=Path("runs/qa"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dpr-steps", type=int, default=300)
    p.add_argument("--reader-steps", type=int, default=300)
    p.add_argument("--rag-steps", type=int, default=1500)
    p.add_argument("--rag-k", type=int, default=3)
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    if args.job == "export":
        return export(args.out)
    if args.job == "merge":
        results = json.loads(RESULTS.read_text())
        results["dictionary_qa"] = json.loads(args.out.read_text())
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        return None
    args.work.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
