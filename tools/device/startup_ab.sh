#!/usr/bin/env bash
# Start-up of one run, two code trees side by side: the whole process and, where the tree
# records them, the phases to the first step (dpbench.results.STARTUP_PHASES).
#   tools/device/startup_ab.sh OUT_DIR OLD_SRC [ROUNDS]
# OLD_SRC: the src/ folder of the other commit (e.g. `git archive REV src | tar -x -C DIR`,
# carried). Each round runs single, then ddp on one GPU, 20 steps of real CIFAR-10 at batch
# 512 with the gpu feed, the two trees in turn: old first in odd rounds, new first in even
# ones, so that neither always runs on a warmer machine.
set -uo pipefail
out=${1:?usage: startup_ab.sh OUT_DIR OLD_SRC [ROUNDS]} old=${2:?old src} rounds=${3:-3}
py=python3
[ -f data/cifar-10-batches-py/test_batch ] || PYTHONPATH=$PWD/src "$py" -m dpbench.run.cifar_pack .carry/cifar10-jpeg.npz data > /dev/null || exit 3
mkdir -p "$out/runs"
for r in $(seq 1 "$rounds"); do
  for variant in single ddp; do
    order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
    for tree in $order; do
      src=$PWD/src; [ "$tree" = old ] && src=$old
      cfg="{\"variant\":\"$variant\",\"gpus\":1,\"dataset\":\"cifar10\",\"data_root\":\"data\",\"feed\":\"gpu\",\"global_batch\":512,\"max_steps\":20,\"warmup_steps\":5,\"repeat\":$r}"
      dir="$out/runs/$tree-$variant-$r"
      t0=$(date +%s%N)
      PYTHONPATH=$src "$py" -m dpbench.run.launch --config "$cfg" --out "$dir" > "$dir.log" 2>&1
      ms=$(( ($(date +%s%N) - t0) / 1000000 ))
      echo "$tree $variant $r $((ms / 1000)).$(printf %03d $((ms % 1000)))" >> "$out/process_s.txt"
    done
  done
done
"$py" - "$out" <<'PY'
import json, sys, statistics as st
from pathlib import Path
out = Path(sys.argv[1])
rows = [l.split() for l in (out / "process_s.txt").read_text().splitlines()]
print("tree variant | process s (each round) | median | start_s median | images/s median | phases (median s each)")
for tree in ("old", "new"):
    for v in ("single", "ddp"):
        proc = [float(s) for t, var, _, s in rows if (t, var) == (tree, v)]
        recs = [json.loads(p.read_text()) for p in sorted(out.glob(f"runs/{tree}-{v}-*/metrics.json"))]
        start = [r["start_s"] for r in recs if r.get("start_s")]
        ips = [r["throughput"]["images_per_s"] for r in recs if r["throughput"]["images_per_s"]]
        marks = [r.get("startup") or {} for r in recs]
        phases = ""
        if marks and all(marks):
            names = ["imports", "devices", "data", "model", "feed"]
            splits = [[m[n] - (m[names[i - 1]] if i else 0.0) for i, n in enumerate(names)] + [r["start_s"] - m["feed"]]
                      for m, r in zip(marks, recs)]
            phases = " ".join(f"{n} {st.median(c):.2f}" for n, c in zip(names + ["rest"], zip(*splits)))
        print(f"{tree} {v} | {' / '.join(f'{p:.1f}' for p in proc)} | {st.median(proc):.1f} | "
              f"{st.median(start) if start else float('nan'):.1f} | {st.median(ips) if ips else 0:,.0f} | {phases}")
PY
