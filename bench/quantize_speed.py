"""int8 quantisation (compress/quantize.py) against fp32, side by side in one process.

- dynamic int8 encoder inference at 32 x 128: all-MiniLM-L6-v2 (the installed package) and a
  bert-base-sized random model; forward time ratio, embedding cosine to fp32 (mean pooled, on
  real sentences for MiniLM, and over 512 GCIDE definitions where dict-gcide is installed; on the
  timed batch for bert-base), safetensors size ratio; where the
  MiniLM package is not installed (a borrowed machine), `--only minilm-shape` times its shape on
  random weights;
- greedy decoding of a GPT-2-small-sized random model at batch 1 (lmforge.generate, fp32 vs
  weight-only int8 and vs dynamic int8), tokens/s ratio and whether the tokens agree;
- held-out perplexity of a trained decoder (--decoder DIR, an lmforge checkpoint with its
  tokenizer; --heldout FILE, one text a line) in fp32, weight-only and dynamic int8.

Rounds alternate between the models (A B A B ...) on the same input, so load from other processes
hits both alike; ratios of medians are reported. Run it under the CPU lock:

    flock /tmp/lmforge-cpu.lock python -m bench.quantize_speed --out bench/results/quantize.json
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch

import lmforge
from bench.common import machine
from lmforge.compress.quantize import quantize
from lmforge.heads import attach
from lmforge.io import find_model_dir
from lmforge.objectives.clm import CausalLM
from lmforge.quant.int8 import CHOICES, ROW_BUCKETS, choices, int8_linears
from lmforge.quant.int8_ffn import routes
from lmforge.utils.timing import alternating

SENTENCES = ["A man is playing a guitar on the street.", "The new movie is awesome.",
             "A cat sits on the mat and looks out of the window.", "Stock markets fell sharply on Monday.",
             "She reads a book about the history of Rome.", "Two dogs are running through a field.",
             "The recipe needs three eggs and a cup of flour.", "Quantum computers use qubits."] * 4


def saved_bytes(model) -> int:
    """Bytes of the model's safetensors file."""
    with tempfile.TemporaryDirectory() as d:
        model.save(d)
        return (Path(d) / "model.safetensors").stat().st_size


def mean_pool(model, ids, mask) -> torch.Tensor:
    """(B, d) mean of the last hidden states over the mask."""
    h = model(ids, mask, run_heads=False).last_hidden_state
    return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


@torch.no_grad()
def encoder(name: str, fp32, tokenizer, batch: int, length: int, rounds: int) -> dict:
    """Dynamic int8 against fp32 on one encoder: speed, cosine, size."""
    fp32 = fp32.eval()
    int8 = quantize(fp32, "dynamic")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, fp32.config.vocab_size, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    t = alternating({"fp32": lambda: fp32(ids, mask, run_heads=False),
                 "int8": lambda: int8(ids, mask, run_heads=False)}, rounds)
    if tokenizer is not None:
        a, b = (lmforge.embed(SENTENCES, m, tokenizer, truncate=True) for m in (fp32, int8))
    else:
        a, b = mean_pool(fp32, ids, mask), mean_pool(int8, ids, mask)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    size = (saved_bytes(fp32), saved_bytes(int8))
    out = {"model": name, "batch": [batch, length], "fp32_s": t["fp32"], "int8_s": t["int8"],
           "speedup": t["fp32"] / t["int8"], "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
           "fp32_bytes": size[0], "int8_bytes": size[1], "size_ratio": size[1] / size[0],
           "smoothing": {k: v for k, v in (int8.config.quantization.get("smoothing") or {}).items()
                         if k != "layers"}}
    texts = gcide_texts() if tokenizer is not None else []
    if texts:  # the same measure over many real texts: the lowest of 512 is a sterner test than of 8
        a, b = (lmforge.embed(texts, m, tokenizer, truncate=True) for m in (fp32, int8))  # as ST cuts
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        out.update(gcide_texts=len(texts), cosine_min_gcide=float(cos.min()),
                   cosine_mean_gcide=float(cos.mean()))
    return out


def gcide_texts(n: int = 512) -> list:
    """n GCIDE definitions (Debian's dict-gcide), drawn with a fixed seed; none where it is missing."""
    import random

    from lmforge.data.dictionary import definitions

    try:
        found = [d[2] for d in definitions()]
    except FileNotFoundError:
        return []
    random.Random(0).shuffle(found)
    return found[1000:1000 + n]


def decoder_and_prompts(where, heldout, n: int = 4, length: int = 16) -> tuple:
    """(fp32 decoder, (n, length) prompts, its name): the trained one at `where` with the first tokens of
    n held-out lines; else a GPT-2-small-sized random model (seed 0) with one random prompt."""
    if where is None:
        torch.manual_seed(0)
        fp32 = lmforge.build("gpt2").eval()
        if "lm" not in fp32.heads:
            attach(fp32, "lm")
        prompt = torch.randint(1000, fp32.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
        return fp32, prompt, "gpt2 (124M, random init)"
    fp32, tok = lmforge.load(where).eval(), lmforge.load_tokenizer(where)
    ids = [tok.encode(t, add_special_tokens=False).ids for t in Path(heldout).read_text(encoding="utf-8").splitlines()]
    prompts = [i[:length] for i in ids if len(i) >= length][:n]
    return fp32, torch.tensor(prompts), f"{where} (trained)"


@torch.no_grad()
def decoding(new_tokens: int, rounds: int, where=None, heldout=None) -> dict:
    """Greedy decoding at batch 1, fp32 vs weight-only and dynamic int8: tokens/s ratio, and the new tokens
    that agree with fp32's up to the first difference (a greedy run follows its own tokens after it)."""
    fp32, prompts, name = decoder_and_prompts(where, heldout)
    models = {"fp32": fp32, "weight-only": quantize(fp32, "weight-only"), "dynamic": quantize(fp32, "dynamic")}
    models = {n: lmforge.optimize(m) for n, m in models.items()}  # as the jobs run them
    new = {n: [lmforge.generate(m, p[None], max_new_tokens=new_tokens)[0, prompts.shape[1]:] for p in prompts]
           for n, m in models.items()}
    t = alternating({n: (lambda m=m: lmforge.generate(m, prompts[:1], max_new_tokens=new_tokens))
                      for n, m in models.items()}, rounds)
    report = {"model": name, "batch": 1, "prompt": prompts.shape[1], "prompts": len(prompts),
              "new_tokens": new_tokens, "fp32_tokens_per_s": new_tokens / t["fp32"]}
    for mode in ("weight-only", "dynamic"):
        same = [int((a != b).nonzero()[0, 0]) if (a != b).any() else len(a) for a, b in zip(new[mode], new["fp32"])]
        report[mode] = {"seconds": t[mode], "speedup": t["fp32"] / t[mode],
                        "new_tokens_equal_to_fp32_before_a_difference": same}
    report["int8_bytes_ratio"] = saved_bytes(models["weight-only"]) / saved_bytes(fp32)
    return report


def force_kernel(model, kernel: str) -> dict:
    """Make every Int8Linear of `model` run `kernel` at any row count (quant/int8.CHOICES, per shape);
    returns the choices it replaced, for restore_choices."""
    saved = dict(CHOICES)
    for _, m in int8_linears(model):
        for bucket in (*ROW_BUCKETS, "many"):
            CHOICES[(m.mode, m.in_features, m.out_features, bucket, torch.get_num_threads())] = kernel
    return saved


@torch.no_grad()
def perplexity(where: str, heldout: str, block: int) -> dict:
    """Held-out perplexity of the decoder at `where`, on `block`-token windows: fp32, weight-only int8 (the
    kernels chosen for these many-row calls, and forced to int8pack-bf16, the one decoding's single rows
    take) and dynamic int8."""
    fp32, tok = lmforge.load(where).eval(), lmforge.load_tokenizer(where)
    ids = []
    for line in Path(heldout).read_text(encoding="utf-8").splitlines():
        ids += tok.encode(line, add_special_tokens=False).ids + [tok.eos_id]
    blocks = torch.tensor(ids[:len(ids) // block * block]).view(-1, block)  # (N, block)
    report = {"model": where, "heldout": heldout, "tokens": blocks.numel(), "block": block}
    arms = {"fp32": (fp32, None), "weight-only": (quantize(fp32, "weight-only"), None),
            "dynamic": (quantize(fp32, "dynamic"), None)}
    arms["weight-only-int8pack-bf16"] = (arms["weight-only"][0], "int8pack-bf16")
    for name, (model, kernel) in arms.items():
        saved = force_kernel(model, kernel) if kernel else None
        objective, total = CausalLM(model), 0.0
        for chunk in blocks.split(32):
            loss = objective({"input_ids": chunk, "attention_mask": torch.ones_like(chunk)}).loss
            total += float(loss) * chunk.shape[0]  # every window predicts block - 1 tokens
        report[name] = {"perplexity": math.exp(total / blocks.shape[0])}
        if saved is not None:
            CHOICES.clear()
            CHOICES.update(saved)
    for name in arms:
        if name != "fp32":
            report[name]["relative_change"] = report[name]["perplexity"] / report["fp32"]["perplexity"] - 1
    return report


PARTS = ("minilm", "bert-base", "decoding", "perplexity", "minilm-shape")


def main() -> None:
    """Run the comparisons --only names; write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/quantize.json")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--decoder", help="perplexity: a trained lmforge decoder directory (with tokenizer)")
    parser.add_argument("--heldout", help="perplexity: held-out text, one document a line")
    parser.add_argument("--block", type=int, default=64, help="perplexity: tokens per window")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=PARTS[:3], help="the comparisons to run")
    args = parser.parse_args()
    if "perplexity" in args.only and not (args.decoder and args.heldout):
        parser.error("--only perplexity needs --decoder DIR and --heldout FILE")
    if bool(args.decoder) != bool(args.heldout):
        parser.error("--decoder and --heldout go together")
    torch.manual_seed(0)
    report = {"threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(),
              "torch": torch.__version__, "machine": machine()}
    if "minilm" in args.only:
        where = find_model_dir("all-MiniLM-L6-v2")
        minilm, tok = lmforge.load(where), lmforge.load_tokenizer(where)
        report["minilm"] = encoder("all-MiniLM-L6-v2", minilm, tok, args.batch, args.length, args.rounds)
        print(json.dumps(report["minilm"]), flush=True)
    if "minilm-shape" in args.only:  # where the package is not installed: its shape, random weights
        torch.manual_seed(0)  # the same random weights whichever parts ran before
        shape = lmforge.build("bert-base", n_layers=6, d_model=384, n_heads=12, d_ff=1536)
        report["minilm_shape"] = encoder("all-MiniLM-L6-v2's shape (random init)", shape, None,
                                         args.batch, args.length, args.rounds)
        print(json.dumps(report["minilm_shape"]), flush=True)
    if "bert-base" in args.only:
        torch.manual_seed(0)
        report["bert_base"] = encoder("bert-base (random init)", lmforge.build("bert-base"), None,
                                      args.batch, args.length, args.rounds)
        print(json.dumps(report["bert_base"]), flush=True)
    if "decoding" in args.only:
        report["decoding"] = decoding(args.new_tokens, args.rounds)
        print(json.dumps(report["decoding"]), flush=True)
        if args.decoder:
            report["decoding_trained"] = decoding(args.new_tokens, args.rounds, args.decoder, args.heldout)
            print(json.dumps(report["decoding_trained"]), flush=True)
    if "perplexity" in args.only:
        report["perplexity"] = perplexity(args.decoder, args.heldout, args.block)
        print(json.dumps(report["perplexity"]), flush=True)
    report["kernels"], report["ffn_routes"] = choices(), routes()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
