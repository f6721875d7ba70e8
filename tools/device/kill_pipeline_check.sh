#!/usr/bin/env bash
# Does a run stop when its pipeline is killed -9? On the GPU machine (where bash execs the job's
# last command, so the launcher is Snakemake's direct child): start Snakemake in a session of its
# own on a one-GPU ddp run long enough to be mid-training, kill -9 Snakemake once the run has
# logged a step, then list every process that names the run's folder 5 s and 15 s later, and
# print the run's record. Needs Snakemake on PATH (tools/device/session.sh installs the wheels).
#   tools/device/kill_pipeline_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: kill_pipeline_check.sh OUT_DIR}
tag=killcheck
run=results/$tag/runs/ddp-g1-r0
rm -rf "results/$tag"
setsid snakemake --cores all "$run/metrics.json" --config experiment=smoke tag=$tag \
  'train={max_steps: 3000, epochs: 30, eval_each_epoch: false, synthetic_size: 65536, global_batch: 512}' > "$out/killcheck-snakemake.log" 2>&1 &
smk=$!
for _ in $(seq 120); do   # bounded: at most 120 s for the run to reach its first logged step
  grep -q "step" "results/$tag/logs/ddp-g1-r0.log" 2>/dev/null && break
  sleep 1
done
echo "before: $(pgrep -fc "$run") processes name $run"
ps -eo pid,ppid,pgid,etimes,args | grep -F "$run" | grep -v grep | cut -c1-160
kill -9 "$smk"
echo "killed Snakemake (pid $smk) at $(date +%T)"
for wait in 5 15; do
  sleep $(( wait == 5 ? 5 : 10 ))
  echo "${wait} s later: $(pgrep -fc "$run") processes name $run"
  ps -eo pid,ppid,pgid,etimes,args | grep -F "$run" | grep -v grep | cut -c1-160
done
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['status'], '|', r['reason'], '|', r.get('steps'))" \
  "$run/metrics.json" 2>&1
