#!/usr/bin/env bash
# One run on a borrowed GPU machine (the image's own torch; lmforge from src/): what its CPU and GPU
# are, tests/test_cuda.py and the training tests with device=auto (so on the GPU), then the int8
# encoder comparison on two pinned cores, natively and with every library told to run AVX2 code only.
# Writes its logs and JSON under $OUT (default bench/results/borrowed).
set -u
OUT=${OUT:-bench/results/borrowed}
mkdir -p "$OUT"
# wheels carried in .whl (packages the image lacks) go to /tmp/site; lmforge runs from src/ (absolute:
# the tests' subprocesses start elsewhere)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  date -u; nvidia-smi -L 2>&1; lscpu 2>&1 | grep -E 'Model name|^CPU\(s\)|Thread|Socket|MHz'
  grep -m1 -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo; $PY -c "import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.cuda.is_available())"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# --tb=short into $OUT: what failed and why comes back even when the suite runs out of time
tests() { local name=$1 limit=$2; shift 2
  timeout "$limit" $PY -m pytest -q -p no:cacheprovider --tb=short -rfE "$@" > "$OUT/$name.txt" 2>&1
  tail -2 "$OUT/$name.txt"; }
tests cuda_tests 120 tests/test_cuda.py
[ "${SUITES:-1}" = 1 ] && {  # the suites below train with device=auto: on the GPU here
  tests train_tests_on_gpu 120 tests/train --ignore tests/train/test_distributed.py --ignore tests/train/test_compile.py
  tests compress_tests_on_gpu 150 tests/compress
  tests tasks_and_pretrain_tests_on_gpu 150 tests/tasks tests/test_pretrain.py tests/test_pretrain_generative.py
}
[ -n "${MORE:-}" ] && tests more_tests_on_gpu "${MORE_LIMIT:-150}" $MORE  # MORE="tests/bakeoff ..."
[ "${INT8:-1}" = 1 ] || exit 0

tuned="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 OMP_NUM_THREADS=2"
avx2="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
for isa in native avx2; do
  caps=""; [ "$isa" = avx2 ] && caps=$avx2
  timeout 150 env $tuned $caps CUDA_VISIBLE_DEVICES= taskset -c 0,1 $PY bench/quantize_speed.py \
    --only minilm-shape bert-base --rounds 3 --out "$OUT/quantize_$isa.json" 2>&1 | cut -c1-220
done
