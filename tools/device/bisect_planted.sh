#!/usr/bin/env bash
# `dpbench bisect` on one H200 over eight planted environments: e0..e7 are launchers of this
# machine's python (the same torch); e4 (the fifth) and later carry a planted slowdown
# (tools/device/planted_slowdown: a GPU busy-wait of SLOW_US microseconds before every optimizer
# step, through that environment's PYTHONPATH), 460 us by default, about 2% of a 23 ms ResNet18
# fp32 step at batch 512. Watched: the single g1 cell (VARIANTS=single,ddp PLANT_ONLY=ddp
# watches two cells and slows ddp alone, about 12 minutes instead of 6-7). Each step is one paired
# launch of the upgrade experiment, 3 runs a side, 60 steps a run. The report (report.md, .json),
# the log and the step launches (a tgz) go to OUT_DIR; a table of the steps is printed last.
#   [LIMIT=seconds] [VARIANTS=single] [PLANT_ONLY=all] [RESUME=1] tools/device/bisect_planted.sh OUT_DIR [SLOW_US]
# Snakemake must be importable (../shared/DEVICE.md: the carried wheels in /tmp/site).
set -uo pipefail
out=${1:?usage: bisect_planted.sh OUT_DIR [SLOW_US]} slow_us=${2:-460}
variants=${VARIANTS:-single} only=${PLANT_ONLY:-all} name=planted-h200
py=python3 envs=${ENVS_DIR:-/tmp/dpbench-bisect-envs}
mkdir -p "$out" "$envs/planted"
real=$(command -v "$py")
cp tools/device/planted_slowdown/dpbench_planted.py "$envs/planted/" && echo "import dpbench_planted" > "$envs/planted/sitecustomize.py"
pythons=()
for i in 0 1 2 3 4 5 6 7; do
  if [ "$i" -ge 4 ]; then
    printf '#!/bin/sh\nexport PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexec %s "$@"\n' "$envs/planted" "$real" > "$envs/py$i"
  else
    printf '#!/bin/sh\nexec %s "$@"\n' "$real" > "$envs/py$i"
  fi
  chmod +x "$envs/py$i"
  pythons+=("$envs/py$i")
done
export DPBENCH_PLANT_US=$slow_us DPBENCH_PLANT_ONLY=$only   # read only where the module is
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# A fresh bisection; RESUME=1 keeps the launches a stopped one made (they are not made again).
[ "${RESUME:-0}" = 1 ] || rm -rf "results/bisect/$name" results/bisect-$name-*
start=$(date +%s)
timeout -s INT -k 20 "${LIMIT:-470}" "$py" -m dpbench.cli bisect "${pythons[@]}" --name "$name" \
  --variants "$variants" --gpus 1 --repeats 3 --config 'train={max_steps: 60, synthetic_test_size: 2000}' \
  > "$out/bisect.log" 2>&1
echo "dpbench bisect exit $?  ($(( $(date +%s) - start )) s; log: $out/bisect.log)"
cp "results/bisect/$name/report.md" "results/bisect/$name/report.json" "$out/" 2>/dev/null
tar czf "$out/bisect-$name.tgz" --exclude='*.pt' results/bisect/"$name" results/bisect-"$name"-* 2>/dev/null
tail -n 3 "$out/bisect.log"
"$py" - "results/bisect/$name/report.json" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
if not path.exists():
    sys.exit(f"no report at {path}")
r = json.loads(path.read_text())
names = [e["name"] for e in r["environments"]]
fmt = lambda v, pct=True: "-" if v is None else (f"{100 * v:+.2f}%" if pct else f"{v:.2g}")
print(f"{'step':<5}{'base':<6}{'cand':<6}{'cell':<12}{'change':>9}{'detect':>9}{'p_holm':>9}  {'cell verdict':<14}{'step':<13}{'s':>5}")
for s in r["steps"]:
    for c in s["cells"]:
        cell = f"{c['cell'][0]} g{c['cell'][1]}"
        print(f"{s['number']:<5}{names[s['base']]:<6}{names[s['cand']]:<6}{cell:<12}{fmt(c['change']):>9}"
              f"{fmt(c['smallest_detectable']).lstrip('+'):>9}{fmt(c['p_holm'], False):>9}  {c['verdict']:<14}"
              f"{s['verdict']:<13}{s['seconds']:>5.0f}")
res = r["result"]
print(f"result: {res['status']}, first bad {names[res['first_bad']] if res['first_bad'] is not None else '-'} "
      f"(planted from e4); {len(r['steps'])} steps, {r['seconds']:.0f} s")
w = r.get("where_the_time_went")
if w and "change_ms" in w:
    print("where the time went (ms a step):", ", ".join(f"{k} {v:+.3f}" for k, v in w["change_ms"].items()),
          "| grew most:", w["grew_most"], "| top kernel:", w["kernels"][0]["name"][:60] if w["kernels"] else "-")
PY
