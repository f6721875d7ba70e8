#!/usr/bin/env bash
# The sharding experiment (experiments/sharding.yaml) on one GPU count, within one 10-minute
# command: Snakemake gets LIMIT seconds (default 540; the 2-GPU part is sized for ~8.5 min on
# 2 H200, the 1-GPU part ~7.5 min on one); if it is stopped, the runs that finished are still
# collected, drawn and compared (a second call continues where it stopped). Prints sharding.md
# (memory by component and collectives against the closed forms) and copies the set to OUT_DIR.
# Usage (repo root, Snakemake importable):
#   GPUS=2 tools/device/sharding.sh OUT_DIR      # 2x H200: ddp, zero1, fsdp (+ no reshard)
#   GPUS=1 tools/device/sharding.sh OUT_DIR      # one H200: single beside them
set -uo pipefail
out=${1:?usage: GPUS=N sharding.sh OUT_DIR}
gpus=${GPUS:-2}
mkdir -p "$out"
py=${PYTHON:-python3}
tag=$("$py" -m dpbench.cli tag sharding)   # the pipeline's own rule for the default tag
variants=$([ "$gpus" -gt 1 ] && echo "variants=[ddp,zero1,fsdp]" || echo "")
start=$(date +%s)
timeout "${LIMIT:-540}" snakemake --cores all --rerun-incomplete \
  --config experiment=sharding "gpus=[$gpus]" $variants 2>&1 \
  | tee "$out/sharding-snakemake.log" | grep -E "^dpbench|Error|error"
echo "pipeline wall time: $(( $(date +%s) - start )) s"
"$py" -m dpbench.analysis.collect --results-dir results --tag "$tag" --print   # every finished run of the tag
"$py" -m dpbench.report.sharding_plots --results-dir results --tag "$tag"
"$py" -m dpbench.report.sharding_tables --results-dir results --tag "$tag" --out "results/$tag/sharding.md"
cat "results/$tag/sharding.md"
cp -r "results/$tag" "$out/"
