#!/usr/bin/env bash
# Issue 40's one-H200 benchmark: each knob (accumulate, the planted no-op deferral, checkpoint,
# offload, compile) at one rank on ResNet18 and the transformer LM at ~124M and ~1B, every run a
# dpbench run whose record says whether the knob's mechanism held (tools/device/knobs_bench.py).
# Under 8 minutes: no run starts that could end after 430 s. Writes knobs_bench.{json,md,png}
# and runs.tar.gz under $OUT and prints the table last.
#   tools/device/knobs_bench.sh            # repo root, on the GPU machine ($OUT set by the device tool)
set -uo pipefail
out=${OUT:?set OUT to the folder that comes back}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
exec "${PYTHON:-python3}" tools/device/knobs_bench.py --out "$out" --runs-dir /tmp/knobs-runs "$@"
