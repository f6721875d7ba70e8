#!/usr/bin/env bash
# Run one experiment of the pipeline on a GPU machine and pack its small outputs (tables,
# figures, summary, claims, report, per-run metrics and logs; no checkpoints) into OUT_DIR.
# Snakemake gets LIMIT seconds (default 480) so that the packing still happens inside the
# device's per-command limit; a rerun on the same machine continues where it stopped.
# A copied tree may carry no .git or a stale one: export DPBENCH_GIT_SHA=<commit> for provenance.
# Usage (repo root; CIFAR-10 rebuilt under data/ first):
#   LIMIT=480 tools/device/pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args...]
set -uo pipefail
exp=${1:?usage: pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args]}
out=${2:?usage: pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args]}
shift 2
mkdir -p "$out"
start=$(date +%s)
timeout "${LIMIT:-480}" snakemake --cores all --rerun-incomplete "$@" --config experiment="$exp" 2>&1 \
  | tee "$out/$exp-snakemake.log" | grep -E "^dpbench|Error|error|steps \("
echo "pipeline wall time: $(( $(date +%s) - start )) s" | tee -a "$out/$exp-snakemake.log"
tag=$(python3 -m dpbench.cli tag "$exp")   # the pipeline's own rule for the default tag
# Snakemake's report can fail on a mismatched plugin set; it can be rebuilt elsewhere from the outputs.
snakemake --report "results/$tag/report.html" --config experiment="$exp" > "$out/$exp-report.log" 2>&1 || echo "report failed"
tar czf "$out/$exp-results.tgz" --exclude='*.pt' -C results "$tag"
cat "results/$tag/summary.md" 2>/dev/null | head -60
[ -f "results/$tag/claims.md" ] && head -40 "results/$tag/claims.md"
exit 0
