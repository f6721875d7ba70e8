"""The loss-curve test (dpbench.analysis.compare.curves) on real committed curves: two one-H200
launches of the default experiment (an A/A), whose fast curves must pass at 2 vs 2 and 3 vs 3,
and the same curves with a planted shift, which must be found."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import scipy.stats
import pytest

from dpbench import results
from dpbench.analysis.compare import curves
from dpbench.analysis.compare.loss import common_steps, curve_matrix, curves_of

REFERENCE = Path(__file__).resolve().parents[3] / "results" / "reference"
A, B = "h200-torch-2.11.0+cu130", "h200-aa2-torch-2.11.0+cu130"


def fast_curves(tag: str) -> dict[tuple, np.ndarray]:
    """cell -> runs x steps of the cells that promise no determinism."""
    out = {}
    for key, runs in curves_of(results.ResultSet(REFERENCE, tag).table("steps")).items():
        if "deterministic" not in key[2]:
            out[key] = curve_matrix(runs, common_steps(list(runs.values())))
    return out


@pytest.fixture(scope="module")
def aa():
    a, b = fast_curves(A), fast_curves(B)
    assert a.keys() == b.keys() and len(a) == 5
    return a, b


@pytest.mark.parametrize("n", [2, 3])
def test_real_aa_curves_pass(aa, n):
    a, b = aa
    tests = curves.curve_summary_tests({k: (a[k][:n], b[k][:n]) for k in a})
    assert {t.verdict for t in tests.values()} == {"within noise"}
    assert all(t.df == 2 * n - 2 and t.p_holm is not None and t.p_holm >= 0.05 for t in tests.values())


def test_a_planted_shift_is_found_at_three_a_side(aa):
    a, b = aa
    k = ("single", 1, "")
    sd = curves.curve_summary_test(a[k], b[k]).sd
    tests = curves.curve_summary_tests({**{c: (a[c], b[c]) for c in a}, k: (a[k], b[k] + 5 * sd)})
    assert tests[k].verdict == "diverged" and tests[k].change > 4 * sd
    assert {t.verdict for c, t in tests.items() if c != k} == {"within noise"}
    # What the test could see is about what was planted.
    assert 3 * sd < tests[k].smallest_detectable < 6 * sd


def test_a_planted_shift_is_found_at_two_a_side(aa):
    a, b = aa
    k = ("ddp", 1, "")
    base = curves.curve_summary_test(a[k][:2], b[k][:2])
    assert base.verdict == "noise unknown" or base.p_value > 0.05  # unjudged: p only
    shifted = curves.curve_summary_test(a[k][:2], b[k][:2] + 10 * base.sd)
    assert shifted.p_value < 0.05 and shifted.change == pytest.approx(base.change + 10 * base.sd)


def test_summary_is_the_mean_after_the_first_tenth():
    c = np.vstack([np.r_[np.full(10, 100.0), np.full(90, 2.0)], np.arange(100.0)])
    assert curves.curve_summary(c).tolist() == [2.0, float(np.arange(10, 100).mean())]


def test_one_run_a_side_is_noise_unknown_unless_aa_curves_give_it():
    rng = np.random.default_rng(0)
    base, cand = rng.normal(2, 0.05, (1, 50)), rng.normal(2, 0.05, (3, 50))
    t = curves.curve_summary_test(base, cand)
    assert (t.verdict, t.p_value, t.sd) == ("noise unknown", None, None)
    aa = [rng.normal(2, 0.05, (3, 50)) + rng.normal(0, 0.05, (3, 1)) for _ in range(2)]
    t = curves.curve_summary_test(base, cand, aa=aa)
    assert t.df == 2 + 2 + 2 and t.p_value is not None  # cand's 2 df and each A/A launch's 2


def test_identical_runs_and_non_finite_losses():
    c = np.tile(np.linspace(3, 1, 20), (3, 1))
    assert curves.curve_summary_test(c, c).verdict == "noise unknown"
    blown = c.copy()
    blown[0, -1] = np.nan
    t = curves.curve_summary_tests({"k": (c, blown)})["k"]
    assert t.verdict == "diverged" and math.isinf(t.change)


def test_aa_launches_join_the_curve_tests_pool():
    """With --noise-from, the A/A launches' runs of a cell add their degrees of freedom (the two
    compared sets, when among them, are not counted twice): the unpaired test of report format 2."""
    from dpbench.analysis.compare import compare
    aa = ["h200-torch-2.11.0+cu130", "h200-aa2-torch-2.11.0+cu130", "h200-92a6737-torch-2.11.0+cu130"]
    plain = compare(REFERENCE, A, B, report_format=2)
    pooled = compare(REFERENCE, A, B, noise_from=aa, report_format=2)
    fast = [(p, q) for p, q in zip(plain["loss"], pooled["loss"]) if p["mode"] == "envelope" and p["curve_sd"]]
    assert fast and all(p["curve_df"] == 4 and q["curve_df"] == 6 for p, q in fast)
    assert all(q["verdict"] == "within noise" and q["curve_design"] == "unpaired" for _, q in fast)


def test_seed_paired_noise_comes_from_aa_launches_without_the_candidate():
    """Format 3: the same runs carry seeds 0-2 in every launch, so the test is seed-paired; with
    --noise-from naming baseline, candidate and a third launch, the A/A differences are those of
    baseline vs third launch only (3 seeds, 3 df), not of the candidate."""
    from dpbench.analysis.compare import compare
    aa = [A, B, "h200-92a6737-torch-2.11.0+cu130"]
    plain, learned = compare(REFERENCE, A, B), compare(REFERENCE, A, B, noise_from=aa)
    fast = [(p, q) for p, q in zip(plain["loss"], learned["loss"]) if p["mode"] == "envelope" and p["curve_sd"]]
    assert fast and all(p["curve_design"] == "unpaired" for p, _ in fast)   # no A/A launches: unpaired
    assert all(q["curve_design"] == "seed-paired, noise from A/A launches" and 1 <= q["curve_df"] <= 3 for _, q in fast)
    assert all(q["verdict"] == "within noise" for _, q in fast)


def test_aa_difference_variance_pools_every_pair_of_launches_per_seed():
    launches = [{0: 1.0, 1: 2.0, 2: 5.0}, {0: 1.2, 1: 2.1}, {0: 0.9, 3: 7.0}]
    var, df = curves.aa_difference_variance(launches)
    ss = np.var([1.0, 1.2, 0.9]) * 3 + np.var([2.0, 2.1]) * 2  # seeds 2 and 3: one launch each
    assert df == 2 + 1 and var == pytest.approx(2 * ss / 3)


SEEDED = [A, B, "h200-92a6737-torch-2.11.0+cu130", "h200-92a6737-aa2-torch-2.11.0+cu130",
          "h200-1178c54-torch-2.11.0+cu130"]


@pytest.fixture(scope="module")
def seeded():
    """tag -> cell -> (runs x steps, the runs' seeds) of the fast cells, on the steps all reached."""
    from dpbench.analysis.compare import load_set
    from dpbench.analysis.compare.loss import seeds_of
    sides = {t: load_set(REFERENCE, t, "reference") for t in SEEDED}
    per = {t: (curves_of(s["tables"]["steps"]), seeds_of(s)) for t, s in sides.items()}
    cells = [k for k in per[A][0] if "deterministic" not in k[2]]
    out: dict = {t: {} for t in SEEDED}
    for k in cells:
        steps = common_steps([s for c, _ in per.values() for s in c[k].values()])
        for t, (c, sd) in per.items():
            out[t][k] = (curve_matrix(c[k], steps), [sd[(k, r)] for r in sorted(c[k])])
    assert all(out[t][k][1] == [0, 1, 2] for t in SEEDED for k in cells)  # seed = repeat everywhere
    return out


def _paired_tests(seeded, base, cand, n, shift=None, aa=(), seeds=None):
    cells = {k: (seeded[base][k][0][:n], seeded[cand][k][0][:n] + (shift or {}).get(k, 0.0)) for k in seeded[base]}
    seeds = seeds or {k: (seeded[base][k][1][:n], seeded[cand][k][1][:n]) for k in cells}
    return curves.curve_summary_tests(cells, seeds=seeds, aa_seeded={k: [seeded[t][k] for t in aa] for k in cells})


@pytest.mark.parametrize("n", [2, 3])
def test_seed_paired_real_aa_curves_pass(seeded, n):
    for base, cand in ((A, B), (SEEDED[2], SEEDED[3])):
        tests = _paired_tests(seeded, base, cand, n)   # no A/A launches: the unpaired test
        assert {t.design for t in tests.values()} == {"unpaired"}
        assert {t.verdict for t in tests.values()} == {"within noise"}
    learned = _paired_tests(seeded, A, B, n, aa=[A, *SEEDED[2:]])  # the baseline and three others
    assert {t.design for t in learned.values()} == {"seed-paired, noise from A/A launches"}
    # 4 launches x 3 seeds: 3 df of launch offsets, 6 of residuals, Welch-Satterthwaite between
    assert all(3 <= t.df <= 6 for t in learned.values())
    assert {t.verdict for t in learned.values()} == {"within noise"}


def test_seed_paired_finds_a_planted_shift(seeded):
    k = ("single", 1, "")
    aa = [A, *SEEDED[2:]]
    sd = curves.aa_difference_variance(
        [curves._by_seed(curves.curve_summary(seeded[t][k][0]), seeded[t][k][1]) for t in aa])[0] ** 0.5
    # 6 sd of a seed-matched difference: with the launch offset counted once (se 0.69 sd at 3
    # seeds, not 0.58) the test finds 5.1 sd at 80% power on these launches
    tests = _paired_tests(seeded, A, B, 3, {k: 6 * sd}, aa=aa)
    assert tests[k].verdict == "diverged" and tests[k].change == pytest.approx(
        6 * sd + _paired_tests(seeded, A, B, 3, aa=aa)[k].change)
    assert {t.verdict for c, t in tests.items() if c != k} == {"within noise"}
    assert tests[k].smallest_detectable < 6 * sd
    # The unpaired test of the same runs needs more: the seeds' spread is its noise.
    unpaired = curves.curve_summary_tests({c: (seeded[A][c][0], seeded[B][c][0] + (6 * sd if c == k else 0))
                                           for c in seeded[A]})
    assert unpaired[k].smallest_detectable > 6 * sd > tests[k].smallest_detectable
    # Without A/A launches the test stays unpaired, whatever the seeds.
    assert _paired_tests(seeded, A, B, 3, {k: 6 * sd})[k].design == "unpaired"


def test_unmatched_seeds_fall_back_to_the_unpaired_test(seeded):
    k = ("single", 1, "")
    b, c = seeded[A][k][0], seeded[B][k][0]
    base = curves.curve_summary_test(b, c)
    for seeds in (([0, 1, 2], [10, 11, 12]), ([0, 1, 2], [2, None, None]), ([0, 0, 1], [0, 0, 1]), None,
                  ([None] * 3, [None] * 3)):
        t = curves.curve_summary_test(b, c, seeds=seeds, aa_seeded=[seeded[SEEDED[2]][k]])
        assert (t.design, t.df, t.p_value, t.pairs) == ("unpaired", base.df, base.p_value, 0)
    # Two seeds in common and two A/A launches: paired on those two.
    t = curves.curve_summary_test(b, c, seeds=([0, 1, 2], [1, 2, 5]),
                                  aa_seeded=[seeded[SEEDED[2]][k], seeded[SEEDED[3]][k]])
    assert (t.design, t.pairs) == ("seed-paired, noise from A/A launches", 2)


def test_seed_paired_counts_a_launch_offset_once_not_over_sqrt_n():
    """A/A launches whose runs move together (a launch offset, sd 0.05) far more than apart
    (residual sd 0.002): a candidate launch 0.1 above the baseline's, inside their span, is no change. The old se,
    the seed-matched sd over sqrt(n), shrank with the seeds as if the offset averaged out, and
    at 8 seeds called it diverged."""
    rng = np.random.default_rng(3)
    seeds = list(range(8))
    level = {s: 2.0 + 0.1 * rng.normal() for s in seeds}
    launch = lambda off: {s: level[s] + off + 0.002 * rng.normal() for s in seeds}
    aa = [launch(o) for o in (-0.06, -0.03, 0.0, 0.03, 0.06)]
    base, cand = aa[0], launch(-0.06 + 0.1)   # another launch, inside the A/A launches' span
    res = curves._paired(curves.CurveTest(8, 8, None, None, None, None, 0, None, None), base, cand, aa, 0.05)
    old_se = res.sd / math.sqrt(8)
    assert res.se > 2.5 * old_se and res.p_value > 0.05
    assert 2 * scipy.stats.t.sf(abs(res.change) / old_se, res.df) < 0.05   # what the old se said
    few = curves._paired(curves.CurveTest(2, 2, None, None, None, None, 0, None, None),
                         {s: base[s] for s in seeds[:2]}, {s: cand[s] for s in seeds[:2]}, aa, 0.05)
    assert few.se == pytest.approx(res.se, rel=0.1)   # the offset dominates: n barely matters
    assert curves.aa_launch_se(aa[:1], 3) is None and curves.aa_launch_se([{0: 1.0}, {0: 1.1}], 1) is None
