"""dpbench.analysis.noise: the launch-to-launch noise model on simulated A/A data.

The simulations follow what the one-H200 launches showed: a shift common to every cell of a
launch (sd ~0.7%) and a cell's own wobble around it (sd ~0.1%)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpbench.analysis import noise

ALPHA = 0.05


def launches(rng, cells: int, n: int, sigma_launch: float, sigma_cell: float) -> np.ndarray:
    """A cells x n array of log medians: cell levels, one shift per launch, a residual each."""
    level = np.log(rng.uniform(1e4, 5e4, cells))[:, None]
    return level + rng.normal(0, sigma_launch, n)[None, :] + rng.normal(0, sigma_cell, (cells, n))


def test_fit_recovers_both_noise_terms():
    rng = np.random.default_rng(1)
    y = launches(rng, cells=40, n=30, sigma_launch=0.01, sigma_cell=0.002)
    m = noise.fit(y, [f"l{i}" for i in range(30)])
    assert m.df_cell == 39 * 29 and m.df_launch == 29 and m.cells == 40
    assert m.sigma_cell == pytest.approx(0.002, rel=0.05)
    assert m.sigma_launch == pytest.approx(0.01, rel=0.35)
    assert m.shifts["l0"] == 0.0


def test_a_launch_that_shifts_everything_shows_as_its_shift():
    y = np.log([[100.0, 100.0, 98.0], [200.0, 200.0, 196.0], [50.0, 50.1, 49.0]])
    m = noise.fit(y, ["a", "b", "c"])
    assert m.shifts["c"] == pytest.approx(-0.02, abs=0.002)
    assert m.sigma_cell < 0.002 < m.launch_mean_sd


@pytest.mark.parametrize("shape, words", [((5, 1), "at least 2 launches"), ((1, 3), "at least 2 cells")])
def test_too_little_a_a_data_says_what_is_missing(shape, words):
    with pytest.raises(noise.NotEnoughLaunches, match=words):
        noise.fit(np.zeros(shape), [f"l{i}" for i in range(shape[1])])


def test_the_common_shift_ignores_a_minority_of_changed_cells():
    logs = np.log1p([-0.01, -0.011, -0.009, -0.30, -0.01])
    assert math.expm1(noise.common_shift(logs)) == pytest.approx(-0.01, abs=1e-9)


def test_few_launches_give_wide_floors_not_false_alarms():
    """Two launches give the common shift one degree of freedom: its floor is wide (t at 1 df)."""
    y = launches(np.random.default_rng(2), cells=10, n=2, sigma_launch=0.007, sigma_cell=0.001)
    two = noise.fit(y, ["a", "b"])
    y6 = launches(np.random.default_rng(2), cells=10, n=6, sigma_launch=0.007, sigma_cell=0.001)
    six = noise.fit(y6, [f"l{i}" for i in range(6)])
    ratio = lambda m: m.shift_band(ALPHA, 10) / (math.sqrt(2) * m.launch_mean_sd)  # noqa: E731
    assert ratio(two) > 10 > 3 > ratio(six)


def test_a_a_pairs_raise_an_alarm_in_at_most_alpha_of_the_comparisons():
    rng = np.random.default_rng(20261201)
    runs = 400
    alarms = sum(bool(noise.flagged(noise.simulate(rng, fitted=4, changed={}))) for _ in range(runs))
    assert alarms / runs <= ALPHA + 0.02   # binomial slack at 400 draws: ~2 sd


def test_a_cell_of_its_own_is_found_well_below_the_fixed_floor():
    """A 2% slowdown of one cell among ten, with launches shifting by 0.7% sd: the learned
    noise finds it nearly always, where the fixed 5% floor could not see it at all."""
    rng = np.random.default_rng(7)
    found = sum(3 in noise.flagged(v) and v["cells"][3]["departure"] < 0
                for v in (noise.simulate(rng, fitted=4, changed={3: -0.02}) for _ in range(200)))
    assert found / 200 >= 0.95


def test_a_shift_of_every_cell_needs_more_than_the_launches_showed():
    rng = np.random.default_rng(11)
    small = [noise.simulate(rng, fitted=6, changed={}, shift=-0.01) for _ in range(100)]
    large = [noise.simulate(rng, fitted=6, changed={}, shift=-0.08) for _ in range(100)]
    assert sum(v["shift_beyond"] for v in small) / 100 <= 0.2
    assert sum(v["shift_beyond"] for v in large) / 100 >= 0.9


def test_a_cell_that_wobbles_more_than_the_fit_says_gets_no_cheaper_band_from_few_cells():
    """The shift of a comparison of few cells carries their own wobble: with sigma_cell five
    times sigma_launch, a one-cell and a three-cell comparison stay near alpha."""
    rng = np.random.default_rng(3)
    for compared in (1, 3):
        alarms = 0
        for _ in range(400):
            y = launches(rng, cells=10, n=6, sigma_launch=0.002, sigma_cell=0.01)
            model = noise.fit(y[:, :4], [f"l{i}" for i in range(4)])
            changes = {c: math.expm1(y[c, 5] - y[c, 4]) for c in range(compared)}
            alarms += bool(noise.flagged(noise.verdicts(changes, model, ALPHA)))
        assert alarms / 400 <= ALPHA + 0.025, compared


def test_one_cell_is_judged_by_the_shift_alone():
    model = noise.fit(launches(np.random.default_rng(4), 5, 4, 0.007, 0.001), list("abcd"))
    v = noise.verdicts({"x": -0.30}, model, ALPHA)
    assert v["cells"]["x"] == {"departure": 0.0, "departure_beyond": False} and v["shift_beyond"]


@pytest.mark.parametrize("y, words", [
    (np.log([[100.0, 100.0], [200.0, 200.0]]), "identical medians"),
    (np.array([[4.6, -np.inf], [5.3, 5.31]]), "positive, finite median"),   # the log of a 0 median
])
def test_a_a_data_without_noise_or_with_a_zero_median_is_refused(y, words):
    with pytest.raises(noise.NotEnoughLaunches, match=words):
        noise.fit(y, ["a", "b"])


def test_the_median_variance_bound_is_never_below_the_true_one():
    rng = np.random.default_rng(5)
    for k in (1, 2, 3, 4, 5, 8, 15):
        true = np.median(rng.normal(size=(40_000, k)), axis=1).var()
        assert noise.median_variance(k) >= true * 0.98, k


def test_an_interval_across_launches_widens_by_the_launch_noise():
    from dpbench.analysis.noise import LaunchNoise, across_launches
    model = LaunchNoise(["a", "b"], 5, sigma_cell=0.003, df_cell=4, launch_mean_sd=0.007, df_launch=1,
                        sigma_launch=0.004, shifts={"a": 0.0, "b": 0.01})
    low, high = across_launches(99.0, 101.0, 0.75, model)
    z = 1.1503493803760079  # the normal quantile at 87.5%
    assert (low, high) == pytest.approx((99.0 * math.exp(-z * 0.005), 101.0 * math.exp(z * 0.005)))
    none = LaunchNoise(["a", "b"], 5, 0.0, 4, 0.0, 1, 0.0, {"a": 0.0, "b": 0.0})
    assert across_launches(99.0, 101.0, 0.75, none) == (99.0, 101.0)


def test_summary_headline_names_what_its_intervals_cover():
    from pathlib import Path

    from dpbench.report.summarize import render_summary
    ref = Path(__file__).resolve().parents[2] / "results" / "reference"
    tag = "h200-torch-2.11.0+cu130"
    alone = render_summary(ref, tag)
    assert "75% CI of this launch" in alone and "across" not in alone
    aa = [tag, "h200-aa2-torch-2.11.0+cu130", "h200-92a6737-torch-2.11.0+cu130"]
    wide = render_summary(ref, tag, noise_from=aa)
    line = next(x for x in wide.splitlines() if x.startswith("- single on 1 GPU"))
    low, high = (float(v.replace(",", "")) for v in line.split("A/A launches ")[1].split(")")[0].split("–"))
    narrow = next(x for x in alone.splitlines() if x.startswith("- single on 1 GPU"))
    nlow, nhigh = (float(v.replace(",", "")) for v in narrow.split("this launch ")[1].split(")")[0].split("–"))
    assert low < nlow and high > nhigh
