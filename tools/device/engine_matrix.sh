#!/usr/bin/env bash
# The engine's GPU check: all five variants on 1 and 2 GPUs, fp32, global batch 512,
# synthetic and real CIFAR-10; dp with cudnn.benchmark on; the feed benchmark (gpu vs fixed
# batch vs DataLoader). Runs the engine directly, no Snakemake. Usage (repo root):
#   tools/device/engine_matrix.sh OUT_DIR [CIFAR_ROOT]
set -uo pipefail
out=${1:?usage: engine_matrix.sh OUT_DIR [CIFAR_ROOT]}
cifar=${2:-data}
epochs=${EPOCHS:-2}
py=${PYTHON:-python3}
mkdir -p "$out"
run() {  # run ID JSON
  local id=$1 cfg=$2
  echo "=== $id $cfg"
  "$py" -m dpbench.run.launch --config "$cfg" --out "$out/$id" > "$out/$id.log" 2>&1 || echo "exit $? for $id"
  tail -n 2 "$out/$id.log"
}
for ds in cifar10 synthetic; do
  base="\"dataset\":\"$ds\",\"data_root\":\"$cifar\",\"download\":false,\"epochs\":$epochs,\"global_batch\":512,\"warmup_steps\":10"
  [ "$ds" = synthetic ] && base="$base,\"synthetic_size\":50000"
  run "$ds-single-g1" "{$base,\"variant\":\"single\"}"
  for v in dp dp_mean dp_sum ddp; do
    for g in 1 2; do run "$ds-$v-g$g" "{$base,\"variant\":\"$v\",\"gpus\":$g}"; done
  done
done
b="\"dataset\":\"cifar10\",\"data_root\":\"$cifar\",\"download\":false,\"global_batch\":512,\"warmup_steps\":10"
run "cifar10-dp-g2-cudnn_benchmark" "{$b,\"variant\":\"dp\",\"gpus\":2,\"max_steps\":40,\"cudnn_benchmark\":true,\"log_every\":5}"
run "cifar10-single-g1-cudnn_benchmark" "{$b,\"variant\":\"single\",\"max_steps\":98,\"cudnn_benchmark\":true}"
run "cifar10-single-g1-feed_fixed" "{$b,\"variant\":\"single\",\"epochs\":1,\"feed\":\"fixed\"}"
run "cifar10-single-g1-feed_gpu" "{$b,\"variant\":\"single\",\"epochs\":1,\"feed\":\"gpu\"}"
run "cifar10-single-g1-feed_torch" "{$b,\"variant\":\"single\",\"epochs\":1,\"feed\":\"torch\",\"workers\":4}"
"$py" -m dpbench.analysis.collect --runs-dir "$out"
