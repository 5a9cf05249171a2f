"""int8 quantisation (compress/quantize.py) against fp32, side by side in one process.

- dynamic int8 encoder inference at 32 x 128: all-MiniLM-L6-v2 (the installed package) and a
  bert-base-sized random model; forward time ratio, embedding cosine to fp32 (mean pooled, on
  real sentences for MiniLM, on the timed batch for bert-base), safetensors size ratio;
- greedy decoding of a GPT-2-small-sized random model at batch 1 (lmforge.generate, fp32 vs
  weight-only int8 and vs dynamic int8), tokens/s ratio and whether the tokens agree.

Rounds alternate between the models (A B A B ...) on the same input, so load from other processes
hits both alike; ratios of medians are reported. Run it under the CPU lock:

    flock /tmp/lmforge-cpu.lock python bench/quantize_speed.py --out bench/results/quantize.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import lmforge
from lmforge.compress.quantize import quantize
from lmforge.compress.quantize_report import side_by_side
from lmforge.fast.int8 import choices
from lmforge.heads import attach
from lmforge.io import find_model_dir

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
    t = side_by_side({"fp32": lambda: fp32(ids, mask, run_heads=False),
                 "int8": lambda: int8(ids, mask, run_heads=False)}, rounds)
    if tokenizer is not None:
        a, b = (lmforge.embed(SENTENCES, m, tokenizer) for m in (fp32, int8))
    else:
        a, b = mean_pool(fp32, ids, mask), mean_pool(int8, ids, mask)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    size = (saved_bytes(fp32), saved_bytes(int8))
    return {"model": name, "batch": [batch, length], "fp32_s": t["fp32"], "int8_s": t["int8"],
            "speedup": t["fp32"] / t["int8"], "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
            "fp32_bytes": size[0], "int8_bytes": size[1], "size_ratio": size[1] / size[0]}


@torch.no_grad()
def decoding(new_tokens: int, rounds: int) -> dict:
    """Greedy decoding at batch 1 of a GPT-2-small-sized random model: fp32 vs weight-only and dynamic int8."""
    torch.manual_seed(0)
    fp32 = lmforge.build("gpt2").eval()
    if "lm" not in fp32.heads:
        attach(fp32, "lm")
    models = {"fp32": fp32, "weight-only": quantize(fp32, "weight-only"), "dynamic": quantize(fp32, "dynamic")}
    prompt = torch.randint(1000, fp32.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    out = {name: lmforge.generate(m, prompt, max_new_tokens=new_tokens) for name, m in models.items()}
    t = side_by_side({name: (lambda m=m: lmforge.generate(m, prompt, max_new_tokens=new_tokens))
                 for name, m in models.items()}, rounds)
    report = {"model": "gpt2 (124M, random init)", "batch": 1, "prompt": 16, "new_tokens": new_tokens,
              "fp32_tokens_per_s": new_tokens / t["fp32"]}
    for mode in ("weight-only", "dynamic"):
        report[mode] = {"seconds": t[mode], "speedup": t["fp32"] / t[mode],
                        "tokens_agree": float((out[mode] == out["fp32"]).float().mean())}
    report["int8_bytes_ratio"] = saved_bytes(models["weight-only"]) / saved_bytes(fp32)
    return report


PARTS = ("minilm", "bert-base", "decoding")


def main() -> None:
    """Run the three comparisons; write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/quantize.json")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--only", nargs="+", choices=PARTS, default=PARTS, help="the comparisons to run")
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(),
              "torch": torch.__version__}
    if "minilm" in args.only:
        where = find_model_dir("all-MiniLM-L6-v2")
        minilm, tok = lmforge.load(where), lmforge.load_tokenizer(where)
        report["minilm"] = encoder("all-MiniLM-L6-v2", minilm, tok, args.batch, args.length, args.rounds)
        print(json.dumps(report["minilm"]), flush=True)
    if "bert-base" in args.only:
        report["bert_base"] = encoder("bert-base (random init)", lmforge.build("bert-base"), None,
                                      args.batch, args.length, args.rounds)
        print(json.dumps(report["bert_base"]), flush=True)
    if "decoding" in args.only:
        report["decoding"] = decoding(args.new_tokens, args.rounds)
        print(json.dumps(report["decoding"]), flush=True)
    report["kernels"] = choices()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
