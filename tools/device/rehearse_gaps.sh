#!/usr/bin/env bash
# What issue 38 still needs from ONE GPU (an H200; on an H100 fewer budgets fit N ranks), at a
# commit whose runs mark the backward's first gradient (run.components.BACKWARD_START, c8f7f8d
# on): each line one rehearse.py launch with a
# time budget of its own (--budget-s counts from the tool's start, start-up included, and is
# shared by every --ranks of one invocation: one N per invocation), in order of what it settles.
#
#   tools/device/rehearse_gaps.sh a   # ~5 min: 236M fsdp at N = 1 with the mark (the one-rank case
#                                     # the H200's 236M rows are predicted from; its older one measured
#                                     # the backward from the forward's end), 236M fsdp and hsdp at
#                                     # N = 8 (fsdp's backward miss; hsdp never ran there), 1.08B zero1
#                                     # and fsdp at N = 1 (their N = 4 peaks have no one-rank case)
#   tools/device/rehearse_gaps.sh b   # ~5.5 min: 1.08B fsdp at N = 4 with the mark (its backward lies
#                                     # above both parts the model predicts) and a search not cut short
# (a and b ran on an H100 at 1307c9b.) From 56c1f32 on, runs mark each unit's part of the backward
# (run.components.BACKWARD_UNIT), and from 86d847e rehearsed GPU records hold each stream's cache
# segments (reserved_segments_mib):
#   tools/device/rehearse_gaps.sh c   # ~4 min, H100 or H200: 1.97B fsdp at N = 1 with its parts (the
#                                     # one-rank case its N = 2 and 4 rows are predicted from; no CPU
#                                     # here holds one rank of it), 1.08B fsdp at N = 1 (the GPU's parts
#                                     # beside cpu-tracker-56c1f32's), 236M fsdp at N = 8 with its
#                                     # segments (the reserved miss: its default stream's pool)
#   tools/device/rehearse_gaps.sh d   # ~5.5 min, an H200 only: 1.97B fsdp and fsdp-keep at N = 8, fsdp
#                                     # searched within 16GB (8 x 16.6 GiB fit 140 GiB). From 5191b45 the
#                                     # profiled fsdp case fits an H100 too (ran at 11dc2db); hsdp does not
#                                     # fit an H200 either: the allocator's replay gives rank 0 17.9 GiB
#                                     # reserved (cpu-alloc-5aa7b30), 8 ranks 143 GiB, beyond 140 GiB
#   tools/device/rehearse_gaps.sh e   # ~7 min, an H200 only: 1.08B fsdp at N = 4 searched within the
#                                     # 24GB budget too (4 ranks of 24GB do not fit an H100)
# (c ran on an H100 at ceb1b88.) From c0d8ecd on, runs mark the loss's peak apart (loss_peak_mib)
# and the model keeps fsdp-without-resharding's units moment by moment (memory_model.kept_units):
#   tools/device/rehearse_gaps.sh f   # ~5.5 min, H100 or H200: 236M and 1.08B fsdp at N = 1 with the
#                                     # loss marked, 236M fsdp and fsdp-keep at N = 2 and fsdp at N = 4
#                                     # with their segments (the reserved miss at N = 8, stream by
#                                     # stream), 1.08B fsdp-keep at N = 2 (the rule on a GPU, blind)
# From 5191b45 on, run.sharded.shard_model empties the cache after sharding: the whole model's
# freed segments go (a rank whose step is small beside the model kept them: 1.97B, 1.08B at N = 8).
# g ran on an H100 at 11dc2db.
#   tools/device/rehearse_gaps.sh g   # ~6 min, H100 or H200: 236M fsdp at N = 1, 2, 4 and 8 with their
#                                     # segments (fsdp-keep at 2, hsdp at 8), 1.08B fsdp at N = 1 and
#                                     # fsdp-keep at N = 2: reserved without the whole model's segments
# From 209515f on, DPBENCH_ALLOC_HISTORY makes rank 0 write the allocator's own history of each
# case (run.alloc_history; analysis.gpu_alloc_history replays it):
#   tools/device/rehearse_gaps.sh h   # ~4 min, H100 or H200: with the allocator's history, 1.08B fsdp
#                                     # at N = 1 (the GPU holds one 262 MiB segment more than the replay,
#                                     # the root unit's size, from ceb1b88 on) and 236M fsdp at N = 2 (the
#                                     # side streams' shortfall and the default stream's +132 MiB)
# The C9 cells the searches still lack (claims.c9.docs, rehearsal_not_run), each call ~9 min:
#   tools/device/rehearse_gaps.sh i   # an H200 only: N = 8 within 16GB, 1.08B zero1 (its state,
#                                     # 12.6 GiB a rank, leaves a batch of 0 or 1: the one N = 8 cell
#                                     # that can move zero1's crossover), then fsdp at 1.08B and 1.97B
#   tools/device/rehearse_gaps.sh j   # H100 or H200: 1.08B ddp, zero1 and fsdp at N = 2 (no DDP row
#                                     # there yet; fsdp's search was cut short), then on an H200 1.08B
#                                     # fsdp at N = 4 searched within 24GB too
#   tools/device/rehearse_gaps.sh k   # an H200 only, ~9.5 min: 1.08B zero1 at N = 8 again (i's launch
#                                     # was killed: each launch's log now ends with the host's lowest
#                                     # available memory; from 399b0d0 on, rehearsed ranks
#                                     # hand gloo's page-locked staging back around each optimizer step,
#                                     # run.host_staging, and records hold each rank's host peaks), its
#                                     # batch 1 at N = 4 peaked 14,817 MiB, less half its 1,026 MiB of
#                                     # momentum is 32 MiB inside 16GB's 14 GiB; then hsdp and
#                                     # fsdp-keep at N = 8 within 16GB
# From d9bc110 on a search's trials go to the line's edge (rehearsal.edge_search): two trials a
# budget where bisection took up to seven.
#   tools/device/rehearse_gaps.sh l   # H100 or H200: 1.08B fsdp at N = 2 alone, its search given the
#                                     # time it lacked twice, then 1.08B fsdp-keep at N = 4 (its first)
#   tools/device/rehearse_gaps.sh m   # H100 or H200, ~4.5 min: with the allocator's history, 1.08B
#                                     # zero1 at N = 2 and 4 (reserved less allocated: 441 MiB at N = 2,
#                                     # 16 at N = 4, so the slack rule misses N = 4 by -6.7%)
#   tools/device/rehearse_gaps.sh n   # an H200 only, ~9.5 min: k reordered by what each launch
#                                     # settles: 1.08B zero1 at N = 8 (the one size a crossover still
#                                     # lacks, claims.c9.rehearsed.open_cells), 236M hsdp at N = 8 (its
#                                     # search there never ran), then 1.08B fsdp-keep at N = 8
#   tools/device/rehearse_gaps.sh any # k on an H200, else l (what each card still has to give)
#
# Estimates for c and d, from h100-rehearsal-1307c9b's logs: 1.97B fsdp, zero1 and ddp at N = 1 in
# 108 s, so fsdp alone ~60 s; 236M fsdp and hsdp at N = 8 with the one-rank cases in 186 s; 1.97B
# fsdp and zero1 at N = 4 ~300 s, so fsdp at N = 8 (twice the ranks, half the shard) ~300 s;
# 1.08B fsdp at N = 4 ~19.5 s a step over gloo, ~9 steps a budget's search, two budgets ~360 s.
# Estimates for a and b, from h200-rehearsal-a7dce61's logs: the 1.08B one-rank ddp case ~45 s, so zero1's and
# fsdp's ~45-60 s each; 236M at N = 8, 5 cases in 101 s, so 2 in ~60 s; 1.08B fsdp at N = 4, 19.5 s a
# step over gloo, ~9 steps with its search, ~200 s; start-up ~15-25 s a launch.
# Writes $OUT/<name>.tar.gz (the tool's tar) and $OUT/<name>.log per launch, and gpu.txt; a also
# gloo_clone.log (tools/device/gloo_clone_probe.py, ~20 s). The device tool returns 8 files a call:
# for f, g and any, join the logs after (cat "$OUT"/*.log > logs.txt) and remove them.
set -uo pipefail
step=${1:?a, b, c, d, e, f, g, h, i, j, k, l, m, n or any}
out=${OUT:-/tmp/rehearse-gaps}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$out/gpu.txt"

launch() {   # name limit_s budget_s rehearse.py's arguments...
    local name=$1 limit=$2 budget=$3
    shift 3
    local t0 sampler
    t0=$(date +%s)
    # the host's available memory every 2 s: a rank killed by signal 9 leaves no trace of why
    # (h200-rehearsal-72e1378's zero1 at N = 8), and the lowest value says whether the host ran out
    (while sleep 2; do awk '/MemAvailable/ {print $2}' /proc/meminfo; done) > "/tmp/gaps-$name.mem" &
    sampler=$!
    timeout -k 5 "$limit" python3 tools/device/rehearse.py "$@" --out "/tmp/gaps/$name" \
        --work "/tmp/gaps/w-$name" --budget-s "$budget" > "$out/$name.log" 2>&1
    echo "$name: exit $?, $(( $(date +%s) - t0 )) s" | tee -a "$out/$name.log"
    kill "$sampler" 2>/dev/null
    echo "host memory: lowest MemAvailable $(sort -n "/tmp/gaps-$name.mem" | head -1) kB of" \
        "$(awk '/MemTotal/ {print $2}' /proc/meminfo) kB" >> "$out/$name.log"
    dmesg 2>/dev/null | grep -i -E "out of memory|killed process" | tail -3 >> "$out/$name.log"
    cp /tmp/gaps/"$name"/rehearsal-*.tar.gz "$out/$name.tar.gz" 2>/dev/null
}

case $step in
a)
    # gloo's own GPU copies, beside the cases: the suspect for 1.08B fsdp's backward at N = 4
    timeout -k 5 90 python3 tools/device/gloo_clone_probe.py > "$out/gloo_clone.log" 2>&1
    launch n1-235m-1b 190 150 --ranks 1 --sizes 235m 1b --variants fsdp zero1
    launch n8-235m 110 60 --ranks 8 --sizes 235m --variants fsdp hsdp
    ;;
b)
    launch n4-1b-fsdp 330 240 --ranks 4 --sizes 1b --variants fsdp
    ;;
c)
    launch n1-2b-fsdp 150 110 --ranks 1 --sizes 2b --variants fsdp
    launch n1-1b-fsdp 110 70 --ranks 1 --sizes 1b --variants fsdp
    launch n8-235m-fsdp 110 70 --ranks 8 --sizes 235m --variants fsdp
    ;;
d)
    launch n8-2b 330 280 --ranks 8 --sizes 2b --variants fsdp fsdp-keep
    ;;
e)
    launch n4-1b-24gb 420 360 --ranks 4 --sizes 1b --variants fsdp
    ;;
f)
    launch n1-235m-1b-fsdp 150 100 --ranks 1 --sizes 235m 1b --variants fsdp
    launch n2-235m 120 80 --ranks 2 --sizes 235m --variants fsdp fsdp-keep
    launch n4-235m-fsdp 90 50 --ranks 4 --sizes 235m --variants fsdp
    launch n2-1b-keep 200 130 --ranks 2 --sizes 1b --variants fsdp-keep
    ;;
g)
    launch n1-235m-1b-fsdp 150 100 --ranks 1 --sizes 235m 1b --variants fsdp
    launch n2-235m 120 80 --ranks 2 --sizes 235m --variants fsdp fsdp-keep
    launch n4-235m-fsdp 90 50 --ranks 4 --sizes 235m --variants fsdp
    launch n8-235m 110 60 --ranks 8 --sizes 235m --variants fsdp hsdp
    launch n2-1b-keep 150 100 --ranks 2 --sizes 1b --variants fsdp-keep
    ;;
h)
    export DPBENCH_ALLOC_HISTORY="$out/hist"
    launch n1-1b-fsdp-hist 150 100 --ranks 1 --sizes 1b --variants fsdp
    launch n2-235m-fsdp-hist 120 80 --ranks 2 --sizes 235m --variants fsdp
    ;;
i)
    launch n8-1b-zero1 170 60 --ranks 8 --sizes 1b --variants zero1
    launch n8-1b-2b-fsdp 370 250 --ranks 8 --sizes 1b 2b --variants fsdp
    ;;
j)
    launch n2-1b 330 200 --ranks 2 --sizes 1b --variants ddp zero1 fsdp
    if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
        launch n4-1b-fsdp 220 60 --ranks 4 --sizes 1b --variants fsdp
    fi
    ;;
k)
    launch n8-1b-zero1 240 110 --ranks 8 --sizes 1b --variants zero1
    launch n8-1b-hsdp-keep 320 210 --ranks 8 --sizes 1b --variants hsdp fsdp-keep
    ;;
l)
    launch n2-1b-fsdp 300 190 --ranks 2 --sizes 1b --variants fsdp
    launch n4-1b-keep 200 100 --ranks 4 --sizes 1b --variants fsdp-keep
    ;;
m)
    export DPBENCH_ALLOC_HISTORY="$out/hist"
    launch n2-1b-zero1-hist 110 30 --ranks 2 --sizes 1b --variants zero1
    launch n4-1b-zero1-hist 140 30 --ranks 4 --sizes 1b --variants zero1
    ;;
n)
    launch n8-1b-zero1 260 140 --ranks 8 --sizes 1b --variants zero1
    launch n8-235m-hsdp 130 70 --ranks 8 --sizes 235m --variants hsdp
    launch n8-1b-keep 170 100 --ranks 8 --sizes 1b --variants fsdp-keep
    ;;
any)
    if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
        bash "$0" k
    else
        bash "$0" l
    fi
    ;;
*)
    echo "usage: $0 a|b|c|d|e|f|g|h|i|j|k|l|m|n|any" >&2
    exit 2
    ;;
esac
