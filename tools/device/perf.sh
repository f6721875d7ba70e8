#!/usr/bin/env bash
# The perf experiment (DDP's knobs, layout, precision, torch.compile), the per-step benchmarks
# (saved with the result set, per torch version) and the targets table, in one command for a GPU
# machine. Snakemake gets LIMIT seconds (default 470; the experiment is sized for about 8.5
# minutes on 2 H200, so there a second call may finish it), the benchmarks BENCH_LIMIT (default 60; 0 leaves them out), so that the
# tables, the archive and the targets still come back inside a 10-minute command; if Snakemake
# is stopped, the runs that finished are collected and the targets name the rest (a second call
# on the same machine continues where it stopped).
# DEFAULT_SET=results/<tag> judges the whole-default-experiment target on that result set (one
# that keeps its Snakemake log in logs/snakemake.log).
# Usage (repo root; CIFAR-10 under data/, Snakemake importable):
#   tools/device/perf.sh OUT_DIR
set -uo pipefail
out=${1:?usage: perf.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
ver=$("$py" -c "import torch; print(torch.__version__)")
tag=$("$py" -m dpbench.cli tag perf)   # the pipeline's own rule for the default tag
log="$out/perf-snakemake.log"
start=$(date +%s)
timeout "${LIMIT:-470}" snakemake --cores all --rerun-incomplete --config experiment=perf 2>&1 \
  | tee "$log" | grep -E "^dpbench|Error|error|steps \("
echo "pipeline wall time: $(( $(date +%s) - start )) s" | tee -a "$log"
[ -f "results/$tag/summary.csv" ] || "$py" -m dpbench.analysis.collect --results-dir results --tag "$tag" >> "$log" 2>&1
# the set keeps every call's log, in order (perf-targets adds up a call and those continuing it)
mkdir -p "results/$tag/logs" && cat "$log" >> "results/$tag/logs/snakemake.log"
if [ "${BENCH_LIMIT:-60}" -gt 0 ]; then
  start=$(date +%s)
  timeout "${BENCH_LIMIT:-60}" "$py" -m pytest tests/benchmarks -q -p no:cacheprovider \
    --benchmark-enable --benchmark-only --benchmark-storage="results/$tag/benchmarks" \
    --benchmark-save="torch-$ver" --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
    > "$out/benchmarks.log" 2>&1
  echo "step benchmarks: $(( $(date +%s) - start )) s"
  grep -E "^test_one|passed|failed|skipped|error" "$out/benchmarks.log" | cut -c1-110 | tail -n 16
fi
# Snakemake's perf_targets rule wrote them already when it finished; again here for a stopped
# call's runs, and with DEFAULT_SET's whole-experiment time
"$py" -m dpbench.cli perf-targets "results/$tag" ${DEFAULT_SET:+--default-experiment "$DEFAULT_SET"} \
  --md "results/$tag/targets.md" --json "results/$tag/targets.json" \
  --figure "results/$tag/figures/recipe_steps.png" --sweep-figure "results/$tag/figures/bucket_sweep.png"
cp "results/$tag/targets.md" "results/$tag/figures/recipe_steps.png" "results/$tag/figures/bucket_sweep.png" "$out/" 2>/dev/null
tar czf "$out/perf-results.tgz" --exclude='*.pt' -C results "$tag"
exit 0
