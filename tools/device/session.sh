#!/usr/bin/env bash
# One experiment of the pipeline on the GPU machine, packed as a reference.
#   tools/device/session.sh OUT_DIR EXPERIMENT TAG LIMIT_S [--config overrides...]
# Sets up once per machine (Snakemake and NVML wheels from .whl/, CIFAR-10 rebuilt from the
# JPEG pack in .carry/ with dpbench.run.cifar_pack), runs Snakemake for at most LIMIT_S seconds
# (a rerun continues where it stopped), then checks and packs the result set with
# dpbench.results.reference (refused unless every run names a clean commit: export DPBENCH_GIT_SHA
# where the copied tree carries no .git) into OUT_DIR/TAG.tgz ('+' in TAG written as '_': the
# device's file transfer drops names with '+'), and prints the summary.
set -uo pipefail
out=${1:?usage: session.sh OUT_DIR EXPERIMENT TAG LIMIT_S [overrides]}
exp=${2:?experiment} tag=${3:?tag} limit=${4:?seconds}
shift 4
py=python3
if [ ! -d /tmp/site/snakemake ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
[ -f data/cifar-10-batches-py/test_batch ] || "$py" -m dpbench.run.cifar_pack .carry/cifar10-jpeg.npz data > /dev/null || exit 3
mkdir -p "$out"
start=$(date +%s)
timeout -s INT -k 60 "$limit" snakemake --cores all --rerun-incomplete --config experiment="$exp" tag="$tag" "$@" \
  > "$out/${tag//+/_}-snakemake.log" 2>&1
rc=$?   # before anything else runs: the line below would read date's status
echo "pipeline wall time: $(( $(date +%s) - start )) s, snakemake exit $rc ($tag)" | tee -a "$out/${tag//+/_}-snakemake.log"
# the set keeps every call's log (the whole experiment's time is only there: perf_targets' 15-minute row)
mkdir -p "results/$tag/logs" && cat "$out/${tag//+/_}-snakemake.log" >> "results/$tag/logs/snakemake.log"
grep -E "^dpbench: [0-9]+ GPU|Error" "$out/${tag//+/_}-snakemake.log" | head -5
[ -f "results/$tag/summary.csv" ] || "$py" -m dpbench.analysis.collect --results-dir results --tag "$tag" > /dev/null 2>&1
if [ "$rc" -ne 0 ]; then   # stopped at the limit or failed: no reference, the set as far as it got
  echo "$tag: INCOMPLETE (snakemake exit $rc): call again on this machine to continue"
  tar czf "$out/${tag//+/_}-partial.tgz" --exclude='*.pt' -C results "$tag"
else
  rm -rf "/tmp/ref/$tag"
  "$py" -m dpbench.results.reference "results/$tag" "/tmp/ref/$tag" && tar czf "$out/${tag//+/_}.tgz" -C /tmp/ref "$tag"
fi
head -c 6000 "results/$tag/summary.md" 2>/dev/null
exit 0
