#!/usr/bin/env bash
# The pre-registered check of the curve test (docs/compare.md, "A pre-registered check of the
# curve test"), on one H200 in about 5-6 minutes:
#   DPBENCH_GIT_SHA=<clean commit> tools/device/curve_prereg.sh OUT
# Four fresh launches of single fp32 ResNet18, one epoch, 4 seeds a launch (lr_curves.yaml), made
# after the rule was frozen: three at lr 0.1 (an A/A set) and one with the planted change
# (prereg_plant.yaml, lr 0.102; PLANT=<overlay.yaml> names another). Then `dpbench compare`:
# each A/A pair with the remaining A/A launch and the baseline as --noise-from (false alarms),
# and the planted launch against the first with all three (power). Refuses to run when the rule's
# files differ from the frozen digest (FROZEN below; the docs name its commit).
# Writes OUT/curve_prereg.tgz (the four references, their Snakemake logs and the reports) and
# OUT/curve_prereg.md (the table it prints last).
set -uo pipefail
out=${1:?usage: curve_prereg.sh OUT}
plant=${PLANT:-tools/device/prereg_plant.yaml}
FROZEN=${FROZEN:-6f7cf4c6f4d9606b}   # curves.py + stats.py at 6d36bf5
py=python3
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src
digest=$(cat src/dpbench/analysis/compare/curves.py src/dpbench/analysis/compare/stats.py | sha256sum | cut -c1-16)
if [ "$digest" != "$FROZEN" ]; then
  echo "the curve test's files (curves.py, stats.py) are not the frozen rule: digest $digest, frozen $FROZEN"
  [ "${ALLOW_UNFROZEN:-0}" = 1 ] || exit 2
fi
sha=${DPBENCH_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export DPBENCH_GIT_SHA=$sha
work=$(mktemp -d)
mkdir -p "$work/logs"
if [ -n "${REF_TAGS:-}" ]; then   # a dry run on existing references (CPU test): "aa1 aa2 aa3 planted"
  read -r -a tags <<<"$REF_TAGS"
  aa=("${tags[@]:0:3}") planted=${tags[3]}
  ref=$(mktemp -d) && for t in "${tags[@]}"; do ln -sfn "$(realpath "${REF_DIR:?}/$t")" "$ref/$t"; done
else
  aa=(prereg-aa1-${sha:0:7} prereg-aa2-${sha:0:7} prereg-aa3-${sha:0:7})
  planted=prereg-plant-${sha:0:7}
  start=$(date +%s)
  for tag in "${aa[@]}"; do
    bash tools/device/session.sh "$work/logs" scaling "$tag" 110 --configfile tools/device/lr_curves.yaml > /dev/null
  done
  bash tools/device/session.sh "$work/logs" scaling "$planted" 110 --configfile tools/device/lr_curves.yaml "$plant" > /dev/null
  echo "four launches: $(( $(date +%s) - start )) s"
  ref=/tmp/ref   # session.sh leaves each checked reference there
  for t in "${aa[@]}" "$planted"; do [ -d "$ref/$t" ] || { echo "$t: no reference made (see $work/logs)"; exit 3; }; done
fi
cmp() {  # baseline candidate noise-from
  "$py" -m dpbench.compare_cli --results-dir "$ref" --baseline "$1" --candidate "$2" --noise-from "$3" > /dev/null
}
cmp "${aa[0]}" "${aa[1]}" "${aa[0]},${aa[2]}"
cmp "${aa[0]}" "${aa[2]}" "${aa[0]},${aa[1]}"
cmp "${aa[1]}" "${aa[2]}" "${aa[1]},${aa[0]}"
# the old se (format 3) beside the frozen one, kept under its own name
"$py" -m dpbench.compare_cli --results-dir "$ref" --baseline "${aa[0]}" --candidate "$planted" \
  --report-format 3 --noise-from "${aa[0]},${aa[1]},${aa[2]}" > /dev/null
for f in "$ref/compare/${aa[0]}_vs_${planted}".*; do mv "$f" "${f%.*}.format3.${f##*.}"; done
cmp "${aa[0]}" "$planted" "${aa[0]},${aa[1]},${aa[2]}"
mkdir -p "$out"
"$py" - "$ref" "$sha" "$digest" "${aa[@]}" "$planted" > "$out/curve_prereg.md" <<'PY'
import json, sys
from pathlib import Path
ref, sha, digest, *tags = sys.argv[1:]
aa, planted = tags[:3], tags[3]
rows = []
for path in sorted(Path(ref, "compare").glob("*.json")):
    r = json.loads(path.read_text())
    kind = "planted" if r["candidate"] == planted else "A/A"
    for row in r["loss"]:
        if row.get("curve_design") is None or "deterministic" in str(row.get("options", "")):
            continue
        rows.append((kind, f"{r['baseline']} vs {r['candidate']}", r.get("format"), row["curve_design"],
                     row["curve_change"], row["curve_sd"], row["curve_df"], row["curve_p_holm"],
                     row["smallest_detectable"], row["verdict"]))
print(f"# Pre-registered curve-test check at {sha} (rule digest {digest})\n")
print("| kind | comparison | format | design | change | sd | df | p (Holm) | detectable | verdict |")
print("|---|---|--:|---|--:|--:|--:|--:|--:|---|")
fmt = lambda v: "–" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
for row in rows:
    print("| " + " | ".join(fmt(v) for v in row) + " |")
fa = [r for r in rows if r[0] == "A/A" and r[2] == 4]
found = [r for r in rows if r[0] == "planted" and r[2] == 4]
print(f"\nfalse alarms: {sum(r[-1] == 'diverged' for r in fa)} of {len(fa)} A/A tests; "
      f"planted change found: {sum(r[-1] == 'diverged' for r in found)} of {len(found)}")
PY
tar czhf "$out/curve_prereg.tgz" --exclude='*.tgz' -C "$ref" "${aa[@]}" "$planted" compare -C "$work" logs
rm -rf "$work"
cat "$out/curve_prereg.md"
