#!/usr/bin/env bash
# The CUDA path, checked on a GPU machine in one call (CI has no GPU):
#   bash benchmarks/device_check.sh OUTDIR
# 1. benchmarks/attribution.py on CUDA (peak memory per route is measured there only), at the
#    default size and at 224 px with a 2 GB budget;
# 2. the shipped experiments with device=cuda, each file's captures compared with the same run on
#    the CPU (benchmarks/device_compare.py).
set -o pipefail
out=${1:-/tmp/device_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=0
nvidia-smi -L | tee "$out/gpu.txt"
python3 benchmarks/attribution.py --device cuda 2>&1 | tee "$out/attribution_64.txt"
python3 benchmarks/attribution.py --device cuda --size 224 --budget-mb 2048 --rounds 3 2>&1 | tee "$out/attribution_224.txt"
python3 benchmarks/device_compare.py "$out" 2>&1 | tee "$out/experiments.txt"
