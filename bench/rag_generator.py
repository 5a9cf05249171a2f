"""A pretrained generator for RAG on the built-in questions: a small BART taught to copy by its own
denoising objective (Lewis et al. 2019: text infilling + sentence permutation, reconstructing the
whole text), as RAG's generator is a pretrained BART (Lewis et al. 2020, sec. 2.3).

A random-init generator fine-tuned on the 329 built-in training questions never starts copying the
answer from the retrieved passage (bench/results/retrieval.json "builtin_qa", first run: RAG 0.013
= closed book 0.013). Denoising teaches the copying first, on text that holds no answer to any
test question: the passages of another World (seed 1, --people people, their names and cities not
those of the questions' World). The generator's own byte-level BPE vocabulary (roberta family:
<s> </s> frame BART's examples and RAG's "<s> passage </s> question </s>" inputs) is trained on the
questions' passages, the training questions and answers, and that other World's passages.

    .venv/bin/python -m bench.rag_generator --data runs/qa-builtin --out runs/rag-generator [--steps 1500]
    .venv/bin/python -m bench.retrieval_qa run --data runs/qa-builtin --stages rag \
        --retriever <all-MiniLM-L6-v2's directory> --generator runs/rag-generator/final --rag-k 2 \
        --rag-batch 16 --rag-steps 600 --rag-lr 3e-4 --work runs/qa --out runs/qa/result.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.retrieval_qa import GENERATOR, _records, generator_texts, world_passages
from lmforge.retrieval.dpr import passage_text
from lmforge.retrieval.passages import read_passages
from lmforge.tokenizer.train import train_tokenizer
from lmforge.train import TrainConfig
from lmforge.train.pretrain import pretrain


def main() -> None:
    """Write the corpus and tokenizer, then pretrain the generator with `denoising` under --out."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the folder `retrieval_qa.py export` wrote")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--people", type=int, default=1500, help="people in the other World (its passages: the corpus)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--vocab", type=int, default=1000, help="the generator's BPE vocabulary")
    args = p.parse_args()
    if args.people < 10 or args.steps < 1 or args.vocab < 300:
        p.error("--people must be >= 10, --steps >= 1, --vocab >= 300")
    if not (args.data / "passages.jsonl").is_file():
        p.error(f"--data {args.data}: no passages.jsonl (run retrieval_qa.py export first)")
    corpus = [passage_text(p) for p in world_passages(1, args.people)[1]]  # another World: seed 1
    questions = read_passages(args.data / "passages.jsonl")
    if {passage_text(q) for q in questions} & set(corpus):
        p.error("the other World shares passages with the questions' World: pick another --people")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus.txt").write_text("\n\n".join(corpus) + "\n")
    texts = generator_texts(questions, _records(args.data / "train.jsonl")) + corpus
    tokenizer = train_tokenizer(texts, "bpe", args.vocab, family="roberta")
    sizes = {k: v for k, v in GENERATOR.items() if k != "dropout"}
    pretrain("denoising", args.out, TrainConfig(steps=args.steps, batch_size=16, lr=5e-4, warmup=100, seed=0,
                                                progress=True, log_every=50),
             preset="bart-base", data=[str(args.out / "corpus.txt")], tokenizer=tokenizer,
             overrides={**sizes, "dropout": GENERATOR["dropout"], "vocab_size": tokenizer.vocab_size})
    print(f"wrote {args.out / 'final'}")


if __name__ == "__main__":
    main()
