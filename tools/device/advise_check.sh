#!/usr/bin/env bash
# `dpbench advise` and its --check on ONE H200 (issue 42), under 4 minutes: the transformer LM at
# ~1.07B parameters (2048 x 20, seq 512, vocab 32768, fp32) and ResNet18 (CIFAR-10 shapes), each
# at --gpus 1 (the GPU itself) and --gpus 2 (two rehearsed ranks sharing it: memory only), each
# probed at one rank and its recommended setup (and at one GPU a runner-up) run for 3 steps
# through dpbench's launcher, predicted against measured.
#
#   OUT=/tmp/advise-out tools/device/advise_check.sh          # on the device
#   OUT=/tmp/x tools/device/advise_check.sh --tiny            # the CPU path: a tiny LM, 2 gloo ranks
#
# Estimate: the 1B probe ~25 s (two batches, then checkpointed), a 1B launch ~30 s at one GPU and
# ~60 s rehearsed (FSDP2 over gloo); ResNet18 ~10 s a probe, ~15 s a launch: ~4 x 55 s; then
# timm's ViT-S/16 and Hugging Face's GPT-2 (the GPU image's libraries), ~20 s a probe. Every call
# has its own timeout (120 + 75 + 90 + 90 + 90 + 40 + 50 s), so the script ends within 9.5 minutes
# whatever happens; a call cut short leaves its line in advise.log.
#
# Writes under $OUT: advise-<name>-g<N>.json (the table's data, the probe's facts, the check's
# rows) and advise-<name>-g<N>.md (the table, the sentence, predicted against measured), advise.log,
# and all of them again in advise.tgz (the device returns at most 8 files a call: read the tar).
set -uo pipefail
out=${OUT:-/tmp/advise-out}
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$(dirname "$0")/../.." && pwd)/src"
LM1B='{name: transformer-lm, args: {width: 2048, layers: 20}}'
RESNET='resnet18-cifar10'
VIT=tools/device/outside_models.py:vit_small
GPT2=tools/device/outside_models.py:gpt2
TINY='{name: transformer-lm, args: {width: 32, layers: 2, heads: 2, seq_len: 16, vocab: 64}}'

advise() {   # name gpus timeout_s workload args...
    local name=$1 gpus=$2 limit=$3 workload=$4
    shift 4
    echo "== $name --gpus $gpus ($(date -u +%T))" | tee -a "$out/advise.log"
    timeout "$limit" python3 -m dpbench.cli advise "$workload" --gpus "$gpus" \
        --json-out "$out/advise-$name-g$gpus.json" "$@" > "$out/advise-$name-g$gpus.md" 2>> "$out/advise.log"
    echo "   exit $? ($(date -u +%T))" | tee -a "$out/advise.log"
    cat "$out/advise-$name-g$gpus.md"
}

if [ "${1:-}" = "--tiny" ]; then
    advise tiny 2 120 "$TINY" --gpu-memory 1 --device cpu --check --runners-up 0
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/advise.log"
advise lm1b 1 120 "$LM1B" --gpu-memory 80 --check --runners-up 1
advise lm1b 2 75 "$LM1B" --gpu-memory 80 --check --runners-up 0
advise resnet18 1 90 "$RESNET" --gpu-memory 24 --probe-batches 32 128 --check --runners-up 1
advise resnet18 2 90 "$RESNET" --gpu-memory 24 --probe-batches 32 128 --check --runners-up 1
# models nobody here wrote (the image's timm and transformers, built from configs)
advise vit-s16 1 90 "$VIT" --gpu-memory 24 --precision bf16 --probe-batches 32 64 --check --runners-up 1
advise vit-s16 8 40 "$VIT" --gpu-memory 16 --precision bf16 --probe-batches 32 64
advise gpt2 8 50 "$GPT2" --gpu-memory 24 --precision bf16 --probe-batches 2 4
tar czf "$out/advise.tgz" -C "$out" --exclude=advise.tgz .
