#!/usr/bin/env bash
# Rehearsed ranks on ONE H200 (issue 38): memory per rank of ddp, zero1, fsdp (with and without
# resharding) and hsdp (shard groups of 2) at N = 1, 2, 4, 8 against the memory model, their
# counted collectives against the traffic model, and C9's largest per-rank batch within two
# budgets naming real devices (24GB: 22 GiB, 16GB: 14 GiB), on the transformer LM at ~12M, ~42M
# and ~235M parameters (seq 512, vocab 32768, fp32, SGD with momentum). Two device calls:
#
#   tools/device/rehearse.sh 1      # N = 1, 2, 4 and one dpbench launch (fsdp, rehearse: true)
#   tools/device/rehearse.sh 2      # N = 8 (the 24GB budget does not fit: 8 x 25.8 GiB > 139 GiB)
#   tools/device/rehearse_gaps.sh a|b   # the cases issue 38 still needs, one launch each (its header)
#   python3 tools/device/rehearse.py --combine OUT1/rehearsal-part1.tar.gz OUT2/rehearsal-part2.tar.gz --out DIR
#                                   # anywhere, torch-free: the tables, figures and C9 over both parts
#
# Each N is ONE torchrun of dpbench.claims.c9.rehearsal running every case (size x variant) one
# after another, so process start-up (~10-30 s) is paid 3 times in part 1 and once in part 2.
# A case: a warm step and a profiled step at its per-rank batch (12M: 8, 42M: 4, 235M: 2), then
# per budget the doubling-and-bisection search (claims.c1.probe.largest, to 1/8) on measured
# per-rank peaks: batches 1 and 2 first, then ~3-5 measured steps near each budget's edge (the
# rest decided from the straight line through the measured peaks, only beyond 1.15 x the budget).
#
# Estimate (from the H200 numbers: DDP over gloo 2.3 s a step at 2 ranks for 806M
# parameters, ~2.9 ms per M parameters; FSDP2 12 s at 2 and 13.4 s at 4 ranks, ~16 ms per M;
# activations are cheap on an H200 beside gloo's host copies): a case costs ~9-11 steps.
#   12M, 42M: < 0.5 s a step (any variant)        ->  ~2 x 5 variants x 10 x 0.4 s = ~40 s per N
#   235M: ddp/zero1 ~0.7 s, fsdp/hsdp ~3.8 s      ->  2 x 7 s + 3 x 38 s = ~130 s per N >= 4
#                                                     (N=1: ~40 s, N=2: ~90 s; 4 cases there)
#   part 1: the dpbench launch ~40 s + start 3 x ~25 s + N=1 ~60 s + N=2 ~110 s + N=4 ~150 s
#           = ~7.2 min; part 2: start ~30 s + N=8 ~200 s (gloo copies grow with N) = ~4 min.
# SIZES="1b 2b" adds ~1.07B and ~2.0B parameters (per-rank batch 1): beyond these two calls
# (FSDP2 ~16 s a step at 1B over gloo, ~9 steps a case): a third call for N=2 or 4 only.
# No case starts after --budget-s 420 s (the line "not started (time budget spent)" says which),
# so each call ends well within 9 minutes whatever the steps cost; the tables say what ran.
#
# Writes under $OUT (<= 5 files): rehearsal-part<P>.tar.gz (records.jsonl: one record a case with
# every rank's memory components, rank 0's collectives, the searches' trials; the dpbench launch's
# metrics.json as a record; memory_per_rank.csv, collectives.csv, largest_batch.csv,
# not_fitting.json, rehearsal.md, figures), rehearsal.md, largest_batch.png,
# memory_per_rank-<size>.png. Prints the per-rank memory table and C9 last.
set -uo pipefail
part=${1:-1}
out=${OUT:-/tmp/rehearse-out}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
start=$(date +%s)
python3 tools/device/rehearse.py --part "$part" --out "$out" --budget-s "${BUDGET_S:-420}" ${SIZES:+--sizes $SIZES}
echo "rehearse.sh part $part: $(( $(date +%s) - start )) s"
