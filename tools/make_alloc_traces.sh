#!/usr/bin/env bash
# Issue 38: the allocation traces (claims.c9.alloc_trace, rank 0 on fake tensors) of every sharded
# rehearsal case of tools/device/rehearse.py's plan (fsdp, fsdp-keep, hsdp; 11.7M to 1.97B) at
# N = 1, 2, 4, 8, for analysis.caching_allocator's replay (claims.c9.replay_docs reads the tar).
# From the repository root at a clean commit, on any machine (~2 min, <1 GiB on 2 cores):
#   bash tools/make_alloc_traces.sh OUT    # writes OUT/traces.tar.gz and OUT/traces.log
set -euo pipefail
out=${1:?an output folder}
mkdir -p "$out/work"
export PYTHONPATH="$PWD/src"
{
    for n in 1 2 4 8; do
        python3 -c "
import json, sys
sys.path.insert(0, 'tools/device')
import rehearse
sizes = {**rehearse.SIZES, '1b': rehearse.MORE['1b'], '2b': rehearse.MORE['2b']}
json.dump(rehearse.plan(sizes, $n, {}, only=('fsdp', 'fsdp-keep', 'hsdp')), open('$out/work/plan-$n.json', 'w'), indent=1)"
        python3 -m dpbench.claims.c9.alloc_trace --ranks "$n" --plan "$out/work/plan-$n.json" --out "$out/work/traces.jsonl"
    done
} 2>&1 | tee "$out/traces.log"
cp "$0" "$out/work/make_alloc_traces.sh"
tar czf "$out/traces.tar.gz" -C "$out/work" .
