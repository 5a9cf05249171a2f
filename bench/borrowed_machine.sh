#!/usr/bin/env bash
# One run on a borrowed GPU machine (the image's own torch; lmforge from src/): what its CPU and GPU
# are, tests/test_cuda.py and the training tests with device=auto (so on the GPU), then the int8
# encoder comparison on two pinned cores, natively and with every library told to run AVX2 code only.
# Writes its logs and JSON under $OUT (default bench/results/borrowed).
set -u
OUT=${OUT:-bench/results/borrowed}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  date -u; nvidia-smi -L 2>&1; lscpu 2>&1 | grep -E 'Model name|^CPU\(s\)|Thread|Socket|MHz'
  grep -m1 -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo; $PY -c "import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.cuda.is_available())"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

timeout 240 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -40 > "$OUT/cuda_tests.txt"
tail -3 "$OUT/cuda_tests.txt"
timeout 200 $PY -m pytest -q -p no:cacheprovider --tb=line -rfE tests/train \
  --ignore tests/train/test_distributed.py --ignore tests/train/test_compile.py 2>&1 | tail -60 > "$OUT/train_tests_on_gpu.txt"
tail -3 "$OUT/train_tests_on_gpu.txt"

tuned="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 OMP_NUM_THREADS=2"
avx2="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
for isa in native avx2; do
  caps=""; [ "$isa" = avx2 ] && caps=$avx2
  timeout 150 env $tuned $caps CUDA_VISIBLE_DEVICES= taskset -c 0,1 $PY bench/quantize_speed.py \
    --only minilm-shape bert-base --rounds 3 --out "$OUT/quantize_$isa.json" 2>&1 | cut -c1-220
done
