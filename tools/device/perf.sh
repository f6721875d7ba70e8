#!/usr/bin/env bash
# The perf experiment (DDP's knobs, layout, precision, cudnn.benchmark, torch.compile), the
# per-step benchmarks (saved per torch version) and the targets table, in one command for a GPU
# machine. Snakemake gets LIMIT seconds (default 380), the benchmarks BENCH_LIMIT (default 90),
# so that the tables, the archive and the targets still come back inside a 9-minute command;
# if Snakemake is stopped, the runs that finished are collected and the targets name the rest.
# Usage (repo root; CIFAR-10 under data/, Snakemake importable):
#   tools/device/perf.sh OUT_DIR
set -uo pipefail
out=${1:?usage: perf.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
ver=$("$py" -c "import torch; print(torch.__version__)")
tag=$("$py" -m dpbench.cli tag perf)   # the pipeline's own rule for the default tag
start=$(date +%s)
timeout "${LIMIT:-380}" snakemake --cores all --rerun-incomplete --config experiment=perf 2>&1 \
  | tee "$out/perf-snakemake.log" | grep -E "^dpbench|Error|error|steps \("
echo "perf experiment: $(( $(date +%s) - start )) s" | tee -a "$out/perf-snakemake.log"
[ -f "results/$tag/summary.csv" ] || "$py" -m dpbench.collect --results-dir results --tag "$tag" \
  >> "$out/perf-snakemake.log" 2>&1
start=$(date +%s)
timeout "${BENCH_LIMIT:-90}" "$py" -m pytest tests/benchmarks -q -p no:cacheprovider \
  --benchmark-enable --benchmark-only --benchmark-storage=results/benchmarks \
  --benchmark-save="torch-$ver" --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
  > "$out/benchmarks.log" 2>&1
echo "step benchmarks: $(( $(date +%s) - start )) s"
grep -E "^test_one|passed|failed|skipped|error" "$out/benchmarks.log" | cut -c1-110 | tail -n 16
tar czf "$out/perf-results.tgz" --exclude='*.pt' -C results "$tag" benchmarks 2>/dev/null \
  || tar czf "$out/perf-results.tgz" --exclude='*.pt' -C results "$tag"
"$py" tools/device/perf_targets.py "results/$tag" --md "$out/perf-targets.md" --json "$out/perf-targets.json" --figure "$out/recipe_steps.png"
exit 0
