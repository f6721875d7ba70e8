"""The curve test on a real learning-rate change and an A/A, from one launch of
tools/device/curve_lr_check.yaml:

    PYTHONPATH=src python3 tools/device/curve_lr_check.py --tag <tag> [--results-dir results]

prints one row per comparison: runs a side, change of the mean loss after the first tenth, the
pooled sd of a run's summary, p, the smallest change found at 80% power, and the verdict."""
from __future__ import annotations

import argparse

from dpbench import results
from dpbench.analysis.compare.curves import curve_summary_tests
from dpbench.analysis.compare.loss import common_steps, curve_matrix, curves_of

BASE, CAND = ("single", 1, ""), ("single", 1, "lr=0.11")


def comparisons(steps, base=BASE, cand=CAND, n: int = 4) -> list[dict]:
    """A/A (the base cell's first n runs against its next n) and base against cand (first n each),
    each its own test (no Holm: two questions, each asked once)."""
    c = curves_of(steps)
    runs = [*c[base].values(), *c[cand].values()]
    steps_ = common_steps(runs)
    b, k = curve_matrix(c[base], steps_), curve_matrix(c[cand], steps_)
    rows = []
    for name, (x, y) in {"A/A (lr 0.1 vs 0.1)": (b[:n], b[n:2 * n]), f"lr change ({base[2] or 'default'} "
                         f"vs {cand[2]})": (b[:n], k[:n])}.items():
        t = curve_summary_tests({name: (x, y)})[name]
        rows.append({"comparison": name, "runs": f"{t.n_baseline}/{t.n_candidate}", "change": t.change,
                     "sd": t.sd, "p": t.p_value, "detectable": t.smallest_detectable, "verdict": t.verdict})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results")
    p.add_argument("--tag", required=True)
    args = p.parse_args()
    rows = comparisons(results.ResultSet(args.results_dir, args.tag).table("steps"))
    print("| comparison | runs | change | sd | p | detectable | verdict |\n|---|--:|--:|--:|--:|--:|---|")
    for r in rows:
        print(f"| {r['comparison']} | {r['runs']} | " + " | ".join(
            "–" if r[k] is None else f"{r[k]:.3g}" for k in ("change", "sd", "p", "detectable"))
              + f" | {r['verdict']} |")


if __name__ == "__main__":
    main()
