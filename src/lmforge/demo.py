"""`make demo` as far as the project goes today: the configurable core, end to end.

Two small decoders from one codebase — GPT-2 style (learned positions, LayerNorm,
GELU) and Llama style (rotary, RMSNorm, SwiGLU, GQA) — learn the same toy language
(runs of consecutive numbers, so the next token follows from the previous one).
The job logs JSON-lines metrics, saves and reloads each model, and draws the loss
curves and an attention map. The full pretrain -> fine-tune job replaces the toy
language once the data and training issues land.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import lmforge
from lmforge.heads import attach

VOCAB, LENGTH, BATCH = 64, 32, 32
FAMILIES = {
    "gpt2": dict(d_model=64, n_layers=2, n_heads=4, d_ff=128),
    "llama-3.2-1b": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128),
}


def counting_batch(gen: torch.Generator) -> torch.Tensor:
    """(BATCH, LENGTH) runs a, a+1, a+2, ... (mod VOCAB) from random starts."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    return (start + torch.arange(LENGTH)) % VOCAB


def train_one(name: str, out: Path, seed: int, steps: int) -> dict:
    """Train one family on the toy language; return its final metrics."""
    torch.manual_seed(seed)
    model = lmforge.build(name, vocab_size=VOCAB, max_seq_len=LENGTH, dropout=0.0,
                          attention_dropout=0.0, **FAMILIES[name])
    attach(model, "lm")
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses, started = [], time.perf_counter()
    with (out / f"{name}-metrics.jsonl").open("w") as log:
        for step in range(1, steps + 1):
            ids = counting_batch(gen)
            logits = model(ids).logits  # (B, T, V)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
            log.write(json.dumps({"step": step, "loss": round(loss.item(), 5)}) + "\n")
    model.eval()
    model.save(out / name)
    reloaded = lmforge.load(out / name)
    probe = counting_batch(gen)
    with torch.no_grad():
        same = torch.equal(model(probe).logits, reloaded(probe).logits)
        accuracy = (model(probe).logits[:, :-1].argmax(-1) == probe[:, 1:]).float().mean().item()
    return {"model": name, "parameters": model.num_parameters(), "final_loss": losses[-1],
            "next_token_accuracy": accuracy, "reload_identical": same,
            "seconds": time.perf_counter() - started, "losses": losses, "module": model}


def plot(results: list, out: Path) -> None:
    """Loss curves of every family, and the last layer's attention of the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.plot(r["losses"], label=r["model"])
    ax.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="Toy language: training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    model = results[0]["module"]
    ids = (torch.arange(16) + 5)[None] % VOCAB
    with torch.no_grad():
        probs = model(ids, return_attention=True).attentions[-1][0]  # (H, T, T)
    fig, axes = plt.subplots(1, probs.shape[0], figsize=(3 * probs.shape[0], 3))
    for h, ax in enumerate(axes):
        ax.imshow(probs[h].numpy(), cmap="viridis")
        ax.set(title=f"head {h}", xlabel="key", ylabel="query")
    fig.suptitle(f"{results[0]['model']}: last-layer attention")
    fig.tight_layout()
    fig.savefig(out / "attention.png", dpi=120)
    plt.close("all")


def run_demo(out: Path, seed: int = 0, steps: int = 150) -> list:
    """Train, save, reload, report and plot; returns the per-family results."""
    out.mkdir(parents=True, exist_ok=True)
    results = [train_one(name, out, seed, steps) for name in FAMILIES]
    plot(results, out)
    print(f"{'model':14s} {'params':>8s} {'final loss':>10s} {'next-token acc':>15s} {'reload':>7s} {'sec':>6s}")
    for r in results:
        print(f"{r['model']:14s} {r['parameters']:8,d} {r['final_loss']:10.4f} "
              f"{r['next_token_accuracy']:15.3f} {str(r['reload_identical']):>7s} {r['seconds']:6.1f}")
    summary = [{k: v for k, v in r.items() if k not in ("losses", "module")} for r in results]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"plots: {out / 'loss.png'}, {out / 'attention.png'}; metrics: {out}/*-metrics.jsonl")
    return results
