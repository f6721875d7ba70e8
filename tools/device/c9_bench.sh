#!/usr/bin/env bash
# C9 on ONE GPU: the largest per-GPU batch of ddp, zero1 and fsdp at one rank within CAP_GIB
# allocated per GPU (the run option memory_cap_gib), on the transformer family at three sizes
# (~12M, ~235M, ~500M parameters), the samples/s of a short timed run at each largest batch, and
# the claims ledger's C9 section written from those rows (one GPU: what the memory model predicts;
# the crossover is not measured).
#   tools/device/c9_bench.sh [OUT_DIR] [CAP_GIB]     (OUT_DIR default $OUT or /tmp/c9; CAP_GIB 12)
# Every trial is a real dpbench run in a fresh process (ddp and zero1 and fsdp under torchrun).
# The nine searches run at once, sharing the GPU, each within its cap (9 x 12 GiB plus nine CUDA
# contexts fit an H200's 141 GB); the nine timed runs then run one at a time. Bisection to 1/4.
# Estimate on one H200: ~4-6 trials of ~15-30 s per search, in parallel (~2-3 min), then 9 x ~20 s
# of timed runs (~3 min): under 7 minutes. zero1/fsdp that the launcher does not know yet (before
# the sharded-run branch is merged) come out as rows whose reason says so.
set -uo pipefail
out=${1:-${OUT:-/tmp/c9}} cap=${2:-12}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
time python3 -m dpbench.claims.c9.bench --variants ddp zero1 fsdp --gpus 1 --cap-gib "$cap" \
  --sizes 256x4 1024x16 1536x16 --jobs 9 --resolution 0.25 --ledger "$out/ledger" \
  | tee "$out/c9_bench.txt"
cp "$out/ledger/c9/largest_batch.csv" "$out/" 2>/dev/null || true
