"""Regenerate bench/RESULTS.md: every benchmark, lmforge against the reference library.

    python -m bench.run                  # everything, 5 repeats, both allocator environments
    python -m bench.run --repeats 3 --only encoder,mlm --envs default
    python -m bench.run --only encoder,generation --out bench/results/avx512.json

Each allocator environment runs in its own process (the variables must be set before
Python starts); results land in bench/results/<env>.json and the report is rebuilt from
whatever results are there. With --out the suites run in this process (its allocator as it is)
and land in that file alone, machine named, for a CPU other than the report's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# glibc's allocator returns large buffers to the OS after every op (PERF_NOTES.md); "tuned" keeps them
ENVS = {
    "default": {},
    "tuned": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736", "MALLOC_TOP_PAD_": "1073741824"},
}
SUITES = ("peak", "encoder", "mlm", "generation", "sentences", "attention")
DEFAULT_ONLY_IN = {"attention": "default"}  # the sweep measures kernels, not the allocator: one env


def _suite(name: str):
    from bench import attention, encoders, generation, peak, training

    return {"peak": peak.matmul_peak, "encoder": encoders.encoder_inference, "mlm": training.training_step,
            "generation": generation.greedy_generation, "sentences": encoders.sentence_embeddings,
            "attention": attention.scaling_sweep}[name]


def child(env: str, suites: list, repeats: int, quick: bool, out: Path | None = None) -> None:
    """Run the suites in this process and merge them into `out` (default results/<env>.json)."""
    from bench.common import machine
    from lmforge.fast import route
    from lmforge.utils.atomic import atomic_write_text

    fresh = out is not None  # --out: this run's suites alone, whatever the file held
    out = out or HERE / "results" / f"{env}.json"
    results = json.loads(out.read_text()) if out.is_file() and not fresh else {}
    earlier = results.get("machine", {}).get("cpu")
    for name, suite in results.items():  # a suite kept from an earlier run keeps that run's CPU
        if name != "machine" and earlier is not None:
            suite.setdefault("cpu", earlier)
    results["machine"] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)  # before minutes of work, not after
    for name in suites:
        load_before = os.getloadavg()
        start = time.time()
        rows = _suite(name)(repeats, quick)
        results[name] = {"rows": rows, "repeats": repeats, "quick": quick, "seconds": round(time.time() - start, 1),
                         "cpu": results["machine"]["cpu"],
                         "load_before": load_before, "load_after": os.getloadavg(),
                         "date": time.strftime("%Y-%m-%d %H:%M"),
                         # where large fp32 outputs went on this machine (fast/route.py), as measured
                         "fp32_output_routes": route.choices()}
        atomic_write_text(out, json.dumps(results, indent=1))  # a reader never sees half of it
        print(f"[{env}] {name}: {results[name]['seconds']} s", flush=True)


def main(argv=None) -> int:
    """Run the chosen suites under each allocator environment, then rebuild RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke test of the harness)")
    parser.add_argument("--only", default=",".join(SUITES), help=f"comma-separated suites of {', '.join(SUITES)}")
    parser.add_argument("--envs", default="default,tuned", help="allocator environments: default, tuned")
    parser.add_argument("--report-only", action="store_true", help="rebuild RESULTS.md from bench/results")
    parser.add_argument("--out", help="run in this process and write this JSON only (RESULTS.md untouched)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    suites = [s for s in args.only.split(",") if s]
    unknown = [s for s in suites if s not in SUITES] + [e for e in args.envs.split(",") if e not in ENVS]
    if unknown or args.repeats < 1:
        parser.error(f"unknown suite or environment {unknown}" if unknown else "--repeats must be >= 1")
    if args.out and (args.report_only or args.child or args.envs != parser.get_default("envs")):
        parser.error("--out runs in this process, under its own allocator: "
                     "not with --envs, --child or --report-only")
    if args.child or args.out:
        child(args.child or "default", suites, args.repeats, args.quick, Path(args.out) if args.out else None)
        return 0
    for env in ([] if args.report_only else args.envs.split(",")):
        chosen = [s for s in suites if DEFAULT_ONLY_IN.get(s, env) == env]
        if not chosen:
            continue
        command = [sys.executable, "-m", "bench.run", "--child", env, "--only", ",".join(chosen),
                   "--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
        subprocess.run(command, env={**os.environ, **ENVS[env]}, cwd=ROOT, check=True)
    from bench import report

    report.write(HERE / "results", HERE / "RESULTS.md", HERE / "plots")
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
