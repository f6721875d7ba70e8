#!/usr/bin/env bash
# Run one experiment of the pipeline on a GPU machine and pack its small outputs (tables,
# figures, summary, claims, per-run metrics and logs; no checkpoints) into OUT_DIR.
# Usage (repo root; CIFAR-10 rebuilt under data/ first):
#   LIMIT=480 tools/device/pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args...]
# A copied tree may carry no .git or a stale one: export DPBENCH_GIT_SHA=<commit> for provenance.
#
# Time. Snakemake gets LIMIT seconds (default 480) so that the packing still happens inside the
# device's 10-minute limit per command; a run cut off there is finished by calling this again.
# The claims experiment on 2 H200s, estimated from the runs' fixed costs (~10 s a run, ~19 s for
# DDP under torchrun) and the throughputs: 71 runs (16 DDP) about 17 min, the probes
# about 5 min (C1's batch searches and memory snapshots ~2.5, C7's conv timing and its three
# step breakdowns ~1.5, C2-C6 ~1), collect/plots/ledger/report ~1 min: about 23 min of
# Snakemake, so three calls, plus the machine's start, the wheels and CIFAR's rebuild.
# Until Snakemake has built everything the report is skipped (it costs tens of seconds a call).
# For the claims experiment the jobs the ledger's headline rests on run first
# (`python3 -m dpbench.claims.priority first`: C8's fp32 sweep, C1 at 10 and 32,768 outputs, the C7
# probe, about 10 min), and a cut-off call also packs a partial ledger of what is there
# (OUT_DIR/EXPERIMENT-partial.tgz, built on a copy: results/ itself stays Snakemake's).
#
# Resume on a fresh machine (a later session, or after the machine was taken back): unpack the
# last call's OUT_DIR/EXPERIMENT-results.tgz into results/ of the working tree the device copies
# (`mkdir -p results && tar xzf EXPERIMENT-results.tgz -C results`), name `results/<tag>` in the
# run's carry (<tag>: `python3 -m dpbench.cli tag EXPERIMENT`; a few MB), rebuild CIFAR-10 there,
# and call this script again. Without .snakemake/, Snakemake takes every output that exists as
# done (finished runs' metrics.json, probe records) and runs only the rest; a run or probe cut
# off mid-way wrote no record, or a failed one that the cut-off step below dropped, and runs
# again; a set from a machine with fewer GPUs has its "needs N GPUs" records dropped first.
set -uo pipefail
exp=${1:?usage: pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args]}
out=${2:?usage: pipeline_run.sh EXPERIMENT OUT_DIR [snakemake args]}
shift 2
mkdir -p "$out"
tag=$(python3 -m dpbench.cli tag "$exp")   # the pipeline's own rule for the default tag
# A call killed past its limit leaves Snakemake's lock behind: the next call would refuse to start.
if compgen -G ".snakemake/locks/*" > /dev/null; then
  snakemake --unlock --config experiment="$exp" > /dev/null 2>&1
fi
# A set carried from a machine with fewer GPUs keeps "needs 2 GPUs" records: here they run.
python3 -m dpbench.claims.priority stale "$exp" | tee -a "$out/$exp-snakemake.log"
first=()
[ "$exp" = claims ] && mapfile -t first < <(python3 -m dpbench.claims.priority first "$exp")
start=$(date +%s)
cut=$(( start + ${LIMIT:-480} ))
# At the limit Snakemake and every job get SIGINT (timeout signals its whole process group):
# Snakemake stops at once on it (on SIGTERM it waited for the killed jobs a minute and more, and
# left its lock), and is killed if it takes 30 s more.
call_log=$(mktemp)
timeout -s INT -k 30 "${LIMIT:-480}" snakemake --cores all --rerun-incomplete "$@" ${first[@]:+--prioritize "${first[@]}"} \
  --config experiment="$exp" 2>&1 | tee "$call_log" | grep -E "^dpbench|Error|error|steps \("
status=${PIPESTATUS[0]}
echo "pipeline wall time: $(( $(date +%s) - start )) s, snakemake exit $status" | tee -a "$call_log"
cat "$call_log" >> "$out/$exp-snakemake.log"
# The set keeps every call's log, in order: how long the whole experiment took is only there
# (dpbench perf-targets reads it for the default experiment's 15-minute target).
mkdir -p "results/$tag/logs" && cat "$call_log" >> "results/$tag/logs/snakemake.log" && rm -f "$call_log"
if [ "$status" -ne 0 ]; then
  # A DDP run stopped by that signal leaves a record saying it failed, which Snakemake keeps as
  # done: failed records written after the cut go, so that those runs train again.
  python3 -m dpbench.claims.priority cut-off "results/$tag/runs" "$cut" | tee -a "$out/$exp-snakemake.log"
fi
tar czf "$out/$exp-results.tgz" --exclude='*.pt' -C results "$tag"
if [ "$status" -eq 0 ]; then
  # Snakemake's report can fail on a mismatched plugin set; it can be rebuilt elsewhere from the outputs.
  snakemake --report "results/$tag/report.html" --config experiment="$exp" > "$out/$exp-report.log" 2>&1 \
    && tar czf "$out/$exp-results.tgz" --exclude='*.pt' -C results "$tag" || echo "report failed"
  head -60 "results/$tag/summary.md" 2>/dev/null
  [ -f "results/$tag/claims.md" ] && head -40 "results/$tag/claims.md"
elif [ "$exp" = claims ]; then
  echo "INCOMPLETE: call again to finish (this machine), or resume as the header says (a fresh one)"
  part=$(mktemp -d)
  tar cf - --exclude='*.pt' -C results "$tag" | tar xf - -C "$part"
  python3 -m dpbench.analysis.collect --results-dir "$part" --tag "$tag" > /dev/null 2>&1 \
    && python3 -m dpbench.claims.ledger --results-dir "$part" --tag "$tag" \
    > /dev/null 2>&1 && tar czf "$out/$exp-partial.tgz" -C "$part" "$tag" && head -16 "$part/$tag/claims.md"
  rm -rf "$part"
else
  echo "INCOMPLETE: call again to finish"
fi
exit 0
