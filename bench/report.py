"""bench/results/*.json -> bench/RESULTS.md and the plots under bench/plots/."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.attention import LENGTHS, VARIANTS, slope

# the acceptance checks: (suite, row filter, field, target, direction)
CHECKS = [
    ("encoder inference, variable lengths, fp32 (real tokens/s)", "encoder",
     lambda r: r["lengths"] != "all 128" and r["precision"] == "fp32", "ratio", 1.8, ">="),
    ("encoder inference, all lengths 128, fp32", "encoder",
     lambda r: r["lengths"] == "all 128" and r["precision"] == "fp32", "ratio", 1.0, ">="),
    ("MLM step bert-mini (tokens/s)", "mlm", lambda r: r["model"] == "bert-mini", "ratio", 2.0, ">="),
    ("MLM step bert-small (tokens/s)", "mlm", lambda r: r["model"] == "bert-small", "ratio", 1.3, ">="),
    ("MLM step peak memory (lmforge / reference)", "mlm", lambda r: r["objective"] == "mlm", "memory_ratio", 0.6, "<="),
    ("GPT-2 greedy generation, converted weights (new tokens/s)", "generation",
     lambda r: r.get("weights", "converted") == "converted", "ratio", 1.2, ">="),
    ("GPT-2 greedy generation, defaults, any weights, any CPU (issue 18)", "generation", lambda r: True, "ratio",
     1.0, ">="),
]


def _load(folder: Path) -> dict:
    """The allocator environments' results (run.py's results/<env>.json; a `bench.run --out` file of another
    CPU is not one of them)."""
    from bench.run import ENVS

    found = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.stem in ENVS}
    return {env: data for env, data in found.items() if "machine" in data}


def _finetune(folder: Path) -> str:
    """finetune_minilm.py's comparison: accuracy and speed per seed, then mean ± sd."""
    path = folder / "finetune_minilm.json"
    if not path.is_file():
        return "not run (`python -m bench.finetune_minilm`)\n"
    data = json.loads(path.read_text())
    ours, ref = data["runs"]["lmforge"], data["runs"]["reference"]
    rows = [[seed, f"{a['accuracy']:.3f}", f"{b['accuracy']:.3f}", a["examples_per_s"], b["examples_per_s"]]
            for seed, a, b in zip(data["seeds"], ours, ref)]
    mean = [data["summary"][n] for n in ("lmforge", "reference")]
    rows.append(["mean ± sd", *(f"{m['accuracy']['mean']:.3f} ± {m['accuracy']['stdev']:.3f}" for m in mean),
                 *(m["examples_per_s"]["mean"] for m in mean)])
    head = f"{data['steps']} steps, {json.dumps(data['hyper'])}; speed ratio {data['speed_ratio']:.2f}x\n\n"
    return head + _table(["seed", "lmforge accuracy", "reference accuracy", "lmforge ex/s", "reference ex/s"], rows)


def _fmt(x, digits=1) -> str:
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def paired(row: dict) -> str:
    """Each round's reference seconds / lmforge seconds (a round runs both back to back, so load
    on the shared host that lasts a round falls on both): "median (min-max)", or "" without runs."""
    runs = row.get("runs", {})
    if "lmforge" not in runs or "reference" not in runs:
        return ""
    ours, theirs = (r["runs"] if isinstance(r, dict) else r for r in (runs["lmforge"], runs["reference"]))
    ratios = sorted(b / a for a, b in zip(ours, theirs))
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def _checks(results: dict) -> str:
    rows = []
    for label, suite, keep, field, target, direction in CHECKS:
        for env, data in results.items():
            for r in data.get(suite, {}).get("rows", []):
                if keep(r):
                    value = r[field]
                    ok = value >= target if direction == ">=" else value <= target
                    name = r.get("model", "") + (f" batch {r['batch']}" if "batch" in r else "")
                    rounds = paired(r) if field == "ratio" else ""
                    rows.append([label, name, env, f"{value:.2f}", rounds, f"{direction} {target}",
                                 "yes" if ok else "NO"])
    sweep = results.get("default", {}).get("attention", {}).get("rows", [])
    sliding = "sliding-window 512"
    for key, what in (("seconds", "time"), ("peak_mib", "memory")):
        s = slope(sweep, sliding, key)
        rows.append([f"sliding-window {what} log-log slope, T 1024..16384", sliding, "default", f"{s:.2f}", "",
                     "<= 1.15", "yes" if s <= 1.15 else "NO"])
    by = {(r["variant"], r["T"]): r for r in sweep if "seconds" in r}
    for T in LENGTHS:
        if T >= 1024 and (sliding, T) in by and ("full", T) in by:
            faster = by[("full", T)]["seconds"] / by[(sliding, T)]["seconds"]
            rows.append([f"sliding-window vs full attention, T={T} (speed-up)", sliding, "default", f"{faster:.2f}",
                         "", "> 1", "yes" if faster > 1 else "NO"])
    return _table(["check", "case", "allocator env", "measured", "per round: median (range)", "target", "met"],
                  rows)


def _section(results: dict, suite: str, header: list, cells) -> str:
    rows = [[env] + cells(r) for env, data in results.items() for r in data.get(suite, {}).get("rows", [])]
    return _table(["env"] + header, rows) if rows else "(not run)\n"


def _mfu(results: dict) -> str:
    rows = []
    for env, data in results.items():
        peaks = {r["dtype"]: r["gflops"] for r in data.get("peak", {}).get("rows", [])}
        if not peaks:
            continue
        rows.append([env, "matmul ceiling fp32 / bf16 (GFLOP/s)", _fmt(peaks.get("float32", 0.0)),
                     _fmt(peaks.get("bfloat16", 0.0)), ""])
        for suite, label, seconds in (("encoder", "encoder inference", "s"), ("mlm", "training step", "s"),
                                      ("generation", "greedy generation", None)):
            for r in data.get(suite, {}).get("rows", []):
                if "useful_flops" not in r:
                    continue
                if seconds:
                    ours, theirs = r["lmforge_s"] if "lmforge_s" in r else r["tokens"] / r["lmforge_tok_s"], \
                        r["reference_s"] if "reference_s" in r else r["tokens"] / r["reference_tok_s"]
                else:
                    ours, theirs = r["new_tokens"] / r["lmforge_tok_s"], r["new_tokens"] / r["reference_tok_s"]
                peak = peaks.get("bfloat16" if r.get("precision") == "bf16" else "float32")
                what = " ".join(str(r.get(k, "")) for k in ("model", "lengths", "precision", "batch") if k in r)
                rows.append([env, f"{label}: {what}", f"{r['useful_flops'] / ours / 1e9 / peak:.0%}",
                             f"{r['useful_flops'] / theirs / 1e9 / peak:.0%}", _fmt(peak)])
    return _table(["env", "workload", "lmforge MFU", "reference MFU", "peak GFLOP/s"], rows)


def _plots(results: dict, folder: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(exist_ok=True)
    sweep = results.get("default", {}).get("attention", {}).get("rows", [])
    written = []
    for key, label in (("seconds", "time per layer (s)"), ("peak_mib", "peak memory growth (MiB)")):
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for variant in VARIANTS:
            points = sorted((r["T"], r[key]) for r in sweep if r.get("variant") == variant and key in r)
            if points:
                ax.loglog(*zip(*points), marker="o", base=2, label=f"{variant} (slope {slope(sweep, variant, key):.2f})")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.set_title(f"one attention layer, d=768, 12 heads, batch 1: {label.split(' (')[0]}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        path = folder / f"attention_{key}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labels, values = [], []
    for env, data in results.items():
        for suite in ("encoder", "mlm", "generation", "sentences"):
            for r in data.get(suite, {}).get("rows", []):
                labels.append(f"{env}: {suite} " + " ".join(str(r.get(k)) for k in ("model", "lengths", "precision",
                                                                                    "batch") if k in r))
                values.append(r["ratio"])
    if values:
        ax.barh(range(len(values)), values)
        ax.set_yticks(range(len(values)), labels, fontsize=6)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel("lmforge / reference throughput")
        fig.tight_layout()
        path = folder / "ratios.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    plt.close(fig)
    return written


def write(results_dir: Path, out: Path, plots: Path) -> None:
    """Rebuild the markdown report and its plots from every results file."""
    results = _load(results_dir)
    images = _plots(results, plots)
    parts = ["# lmforge vs the reference library: benchmark results\n",
             "Regenerate with `python -m bench.run` (options: `--repeats`, `--only`, `--envs`, `--quick`). "
             "Medians of the repeats, both libraries in one process on the same weights and inputs; "
             "ratio = lmforge / reference throughput (memory: lmforge / reference, lower is better). "
             "The checks are decided on the ratio of the medians; beside it, the same ratio taken round by "
             "round (each round runs both, in alternating order) shows how far the shared machine's noise "
             "moves it. "
             "Allocator env `tuned` = `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 "
             "MALLOC_TOP_PAD_=1073741824` (see PERF_NOTES).\n"]
    for env, data in results.items():
        machine = data.get("machine", {})
        # a suite run on another machine than the file's last run carries its own "cpu"
        loads = [(s, data[s]["load_before"][0], data[s]["load_after"][0], data[s]["repeats"], data[s]["date"],
                  data[s].get("cpu", machine.get("cpu", "")))
                 for s in data if isinstance(data[s], dict) and "load_before" in data[s]]
        parts.append(f"**{env}**: {json.dumps(machine)}\n\n" + _table(
            ["suite", "load avg before", "load avg after", "repeats", "date", "cpu"], loads))
    parts += ["\n## Acceptance checks\n", _checks(results)]
    parts += ["\n## Encoder inference (batch 32 x 128)\n", _section(
        results, "encoder", ["model", "lengths", "precision", "lmforge real tok/s", "reference real tok/s", "ratio",
                             "max |diff|"],
        lambda r: [r["model"], r["lengths"], r["precision"], r["lmforge_tok_s"], r["reference_tok_s"], r["ratio"],
                   f"{r['max_abs_diff']:.1e}"])]
    parts += ["\n## Training steps (AdamW; MLM 32 x 128 with 15 % masked, GPT-2 8 x 128)\n", _section(
        results, "mlm", ["model", "objective", "lmforge tok/s", "reference tok/s", "ratio", "lmforge peak MiB",
                         "reference peak MiB", "memory ratio"],
        lambda r: [r["model"], r["objective"], r["lmforge_tok_s"], r["reference_tok_s"], r["ratio"],
                   r["lmforge_peak_mib"], r["reference_peak_mib"], r["memory_ratio"]])]
    parts += ["\n## GPT-2 small greedy generation (32-token prompt)\n", _section(
        results, "generation", ["weights", "batch", "new tokens", "lmforge tok/s", "reference tok/s", "ratio",
                                "same tokens", "fast paths taken"],
        lambda r: [r.get("weights", "converted"), r["batch"], r["new_tokens"], r["lmforge_tok_s"], r["reference_tok_s"],
                   r["ratio"], "" if r["same_tokens"] is None else r["same_tokens"],
                   ", ".join(f"{k}={v}" for k, v in r.get("fast_paths", {}).items())])]
    parts += ["\n## Sentence embeddings (all-MiniLM-L6-v2, batch 32, tokenising included)\n", _section(
        results, "sentences", ["sentences", "lmforge sent/s", "sentence-transformers sent/s", "ratio", "min cosine"],
        lambda r: [r["sentences"], r["lmforge_sent_s"], r["reference_sent_s"], r["ratio"], f"{r['min_cosine']:.6f}"])]
    parts += ["\n## Attention scaling (one layer, d=768, 12 heads, batch 1; time ms / peak MiB)\n",
              _section(results, "attention", ["variant", "T", "ms", "peak MiB"],
                       lambda r: [r["variant"], r["T"], r["seconds"] * 1e3 if "seconds" in r else r.get("error", ""),
                                  r.get("peak_mib", "")])]
    parts += ["\n## Fine-tuning all-MiniLM-L6-v2 on the built-in entailment task (vs the reference Trainer)\n",
              _finetune(results_dir)]
    parts += ["\n## Model FLOPs utilisation (useful FLOPs only: real tokens, masked positions)\n", _mfu(results)]
    parts += ["\n## Plots\n"] + [f"![{p.stem}](plots/{p.name})\n" for p in images]
    out.write_text("\n".join(parts))
