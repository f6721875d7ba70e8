#!/usr/bin/env bash
# A paired upgrade check on a GPU machine: the upgrade experiment with two environments of this
# machine's torch (venvs on its packages), interleaved ABBA in one launch, then compare --paired.
#   tools/device/paired_upgrade.sh OUT_DIR TAG [SLOW_US [SLOW_ONLY]] [-- snakemake --config args...]
# SLOW_US > 0 plants a slowdown in `cand` only: its sitecustomize.py puts a GPU busy-wait of
# SLOW_US microseconds (torch.cuda._sleep) before every SGD step, in DDP runs only when
# SLOW_ONLY=ddp (one cell) or in every run when SLOW_ONLY=all. SLOW_US=0 is a paired A/A.
# Prints the report's per-cell and whole-launch rows; copies the report into OUT_DIR.
# Needs analysis/compare/paired.py (the stats branch) merged; without it compare exits 2.
set -uo pipefail
mine=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mine+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift   # the rest: --config items for Snakemake (e.g. repeats=2)
out=${mine[0]:?usage: paired_upgrade.sh OUT_DIR TAG [SLOW_US [SLOW_ONLY]] [-- config...]}
tag=${mine[1]:?usage: paired_upgrade.sh OUT_DIR TAG [SLOW_US [SLOW_ONLY]] [-- config...]}
slow_us=${mine[2]:-0} slow_only=${mine[3]:-ddp}
py=python3 envs=${ENVS_DIR:-/tmp/dpbench-envs}
mkdir -p "$out" "$envs"
for side in base cand; do
  [ -x "$envs/$side/bin/python" ] || "$py" -m venv --system-site-packages --without-pip "$envs/$side" || exit 3
done
site=$("$envs/cand/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -f "$site/sitecustomize.py"
if [ "$slow_us" != 0 ]; then
  cat > "$site/sitecustomize.py" <<PY
# Planted by tools/device/paired_upgrade.sh: a ${slow_us} us GPU busy-wait before each SGD step.
import functools
import torch
import torch.distributed as dist

_step = torch.optim.SGD.step


@functools.wraps(_step)
def _slower_step(self, *args, **kwargs):
    if torch.cuda.is_available() and ("$slow_only" == "all" or (dist.is_available() and dist.is_initialized())):
        khz = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 1_980_000)
        torch.cuda._sleep(int($slow_us * khz / 1000))
    return _step(self, *args, **kwargs)


torch.optim.SGD.step = _slower_step
PY
fi
snakemake --cores all --config experiment=upgrade "base=$envs/base/bin/python" "cand=$envs/cand/bin/python" \
  "tag=$tag" "$@" > "$out/$tag-snakemake.log" 2>&1
echo "snakemake exit $?  (log: $out/$tag-snakemake.log)"
PYTHONPATH=$PWD/src "$py" -m dpbench.compare_cli --paired "$tag"; echo "compare exit $?"
cp results/compare/"$tag".base_vs_cand.* "$out"/ 2>/dev/null
"$py" - "results/compare/$tag.base_vs_cand.json" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
if not path.exists():
    sys.exit(f"no report at {path}")
r = json.loads(path.read_text())
fmt = lambda v, pct=True: "-" if v is None else (f"{100 * v:+.2f}%" if pct else f"{v:.3g}")
print(f"{'cell':<14}{'n':>6}{'change':>9}{'smallest':>10}{'p_holm':>9}  verdict")
for row in r["throughput"]:
    runs = f"{row['n_baseline']}/{row['n_candidate']}"
    print(f"{row['variant'] + ' g' + str(row['gpus']):<14}{runs:>6}{fmt(row['change']):>9}"
          f"{fmt(row['smallest_detectable']):>10}{fmt(row['p_holm'], False):>9}  {row['verdict']}")
launch = r["paired"]["launch"]
print(f"{'whole launch':<14}{launch['cells']:>6}{fmt(launch['change']):>9}{fmt(launch['smallest_detectable']):>10}"
      f"{fmt(launch['p'], False):>9}  {launch['verdict']}")
print("order:", r["paired"]["order"], "| design:", r["paired"]["design"])
print("verdict:", r["verdict"]["line"], "| loss:", sorted({x["verdict"] for x in r["loss"]}))
PY
