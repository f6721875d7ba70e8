#!/usr/bin/env bash
# The paired upgrade check's GPU benchmark in one launch: the upgrade experiment with three
# environments of this machine's torch (launchers of its python), interleaved per cell and repeat
# (base same slow, slow same base, ...): `same` is base again (a paired A/A), `slow` carries a
# planted slowdown (tools/device/planted_slowdown: a GPU busy-wait of SLOW_US microseconds before
# every optimizer step; in every run, or in distributed runs only with SLOW_ONLY=ddp). Then two
# comparisons within the launch, base vs same and base vs slow, each printing its per-cell and
# whole-launch rows; the reports are copied into OUT_DIR.
#   [LIMIT=seconds] tools/device/paired_upgrade.sh OUT_DIR TAG SLOW_US [SLOW_ONLY] [-- snakemake --config items...]
set -uo pipefail
mine=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mine+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift   # the rest: --config items for Snakemake (e.g. repeats=2)
usage="usage: paired_upgrade.sh OUT_DIR TAG SLOW_US [SLOW_ONLY] [-- config...]"
out=${mine[0]:?$usage} tag=${mine[1]:?$usage} slow_us=${mine[2]:?$usage} slow_only=${mine[3]:-all}
py=python3 envs=${ENVS_DIR:-/tmp/dpbench-envs}
mkdir -p "$out" "$envs/planted"
# Each environment is a launcher of this machine's python (a venv on its packages may not see an
# image's torch); `slow` puts the planted module first on its PYTHONPATH (a sitecustomize there
# imports it, in torchrun's ranks too, which inherit the variable).
real=$(command -v "$py")
for side in base same; do printf '#!/bin/sh\nexec %s "$@"\n' "$real" > "$envs/$side"; chmod +x "$envs/$side"; done
cp tools/device/planted_slowdown/dpbench_planted.py "$envs/planted/" && echo "import dpbench_planted" > "$envs/planted/sitecustomize.py"
printf '#!/bin/sh\nexport PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexec %s "$@"\n' "$envs/planted" "$real" > "$envs/slow"
chmod +x "$envs/slow"
export DPBENCH_PLANT_US=$slow_us DPBENCH_PLANT_ONLY=$slow_only   # read only where the module is
timeout -s INT -k 30 "${LIMIT:-3600}" snakemake --cores all --config experiment=upgrade \
  "environments={base: $envs/base, same: $envs/same, slow: $envs/slow}" \
  "tag=$tag" "$@" > "$out/$tag-snakemake.log" 2>&1
echo "snakemake exit $?  (log: $out/$tag-snakemake.log)"
for cand in same slow; do
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m dpbench.compare_cli --paired "$tag" --base base --cand "$cand" > /dev/null
  echo "compare base vs $cand: exit $?"
  cp results/compare/"$tag".base_vs_"$cand".* "$out"/ 2>/dev/null
  "$py" - "results/compare/$tag.base_vs_$cand.json" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
if not path.exists():
    sys.exit(f"no report at {path}")
r = json.loads(path.read_text())
fmt = lambda v, pct=True: "-" if v is None else (f"{100 * v:+.2f}%" if pct else f"{v:.3g}")
print(f"== {r['baseline']} vs {r['candidate']}")
print(f"{'cell':<14}{'n':>6}{'change':>9}{'smallest':>10}{'p_holm':>9}  verdict")
for row in r["throughput"]:
    runs = f"{row['n_baseline']}/{row['n_candidate']}"
    print(f"{row['variant'] + ' g' + str(row['gpus']):<14}{runs:>6}{fmt(row['change']):>9}"
          f"{fmt(row['smallest_detectable']):>10}{fmt(row['p_holm'], False):>9}  {row['verdict']}")
launch = r["paired"]["launch"]
print(f"{'whole launch':<14}{launch['cells']:>6}{fmt(launch['change']):>9}{fmt(launch['smallest_detectable']):>10}"
      f"{fmt(launch.get('p_holm', launch['p']), False):>9}  {launch['verdict']}")
print("order:", r["paired"]["order"], "| design:", r["paired"]["design"])
print("verdict:", r["verdict"]["line"], "| loss:", sorted({x["verdict"] for x in r["loss"]}))
PY
done
tar czf "$out/$tag.tgz" --exclude='*.pt' -C results "$tag"
