#!/usr/bin/env bash
# python3 with a planted slowdown of DPBENCH_PLANT_US microseconds (default 230, about 1% of a
# ResNet18 fp32 step at batch 512 on one H200) before every optimizer step: name this script as
# one environment of a paired launch, and python3 as the other.
here=$(cd "$(dirname "$0")" && pwd)
export DPBENCH_PLANT_US=${DPBENCH_PLANT_US:-230} PYTHONPATH="$here/planted_slowdown${PYTHONPATH:+:$PYTHONPATH}"
exec python3 "$@"
