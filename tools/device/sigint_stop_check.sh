#!/usr/bin/env bash
# Does SIGINT to Snakemake stop a GPU training within seconds, with a failed record? On one GPU:
# for a `single` run and a one-rank `ddp` run (NCCL, under torchrun), start Snakemake in a session
# of its own, `kill -INT` Snakemake's pid alone (not its group: the case Snakemake alone did not
# handle) once the run has logged its first step, then time Snakemake's exit, list what is left of
# the run, and print its record. Then the same command with --rerun-incomplete must plan the run
# again (a dry run). Needs Snakemake on PATH (see ../shared/DEVICE.md: the carried wheels).
#   tools/device/sigint_stop_check.sh OUT_DIR      (writes OUT_DIR/sigint-<variant>.log; a table last)
set -uo pipefail
out=${1:?usage: sigint_stop_check.sh OUT_DIR}
mkdir -p "$out"
rows=()
for variant in single ddp; do
  tag=sigint-$variant
  run=results/$tag/runs/$variant-g1-r0
  rm -rf "results/$tag"
  cfg=(experiment=smoke "tag=$tag" "variants=[$variant]" "gpus=[1]" repeats=1
       'train={max_steps: 20000, epochs: 200, eval_each_epoch: false, synthetic_size: 65536, global_batch: 512}')
  setsid snakemake --cores all "results/$tag/summary.csv" --config "${cfg[@]}" > "$out/sigint-$variant.log" 2>&1 &
  smk=$!
  for _ in $(seq 150); do   # bounded: at most 150 s to the run's first step
    grep -q "first step" "results/$tag/logs/$variant-g1-r0.log" 2>/dev/null && break
    sleep 1
  done
  sleep 3
  t0=$(date +%s.%N)
  kill -INT "$smk"
  for _ in $(seq 120); do kill -0 "$smk" 2>/dev/null || break; sleep 0.2; done
  t1=$(date +%s.%N)
  wait "$smk"; code=$?
  took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  sleep 2
  left=$(pgrep -fc "$run" || true)
  rec=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['status'], '|', r['reason'][:70])" \
        "$run/metrics.json" 2>&1 | tail -1)
  snakemake -n --cores all "results/$tag/summary.csv" --rerun-incomplete --config "${cfg[@]}" > "$out/sigint-$variant-resume.log" 2>&1
  resume=$?
  grep -q "rule train" "$out/sigint-$variant-resume.log" && replans=yes || replans=no
  rows+=("$variant | $code | $took s | $left | $rec | $resume/$replans")
done
echo
echo "variant | snakemake exit | SIGINT to exit | processes left | record | resume dry run rc/replans train"
printf '%s\n' "${rows[@]}"
