"""C6's verdict: chunk sizes, reweighting, and the training effect with an interval."""
import math

import pytest

from dpbench.claims import CONFIRMED, NUANCE
from dpbench.claims.c6 import probe as c6_probe
from dpbench.claims.c6 import text as c6_text
from dpbench.claims.c6 import verdict as c6_verdict

from claims.planted import gpu_tag, evidence


@pytest.mark.parametrize("n, k", [(128, 3), (80, 3), (127, 2), (3, 2), (10, 4), (5, 4), (1, 2), (89, 2)])
def test_chunk_sizes_without_torch_match_torch_chunk(n, k):
    assert c6_verdict.chunk_sizes(n, k) == c6_probe.chunk_sizes(n, k)


@pytest.mark.parametrize("n, k", [(6, 4), (8, 4), (127, 2), (128, 3), (5, 4), (10, 4), (9, 3), (1, 2)])
def test_uneven_split_is_what_torch_chunk_gives_not_the_remainder(n, k):
    sizes = c6_probe.chunk_sizes(n, k)
    assert c6_verdict.uneven_split(n, k) == (len(set(sizes)) > 1)
    if (n, k) == (6, 4):   # 2/2/2 on three devices: no bias, though 6 % 4 != 0
        assert sizes == [2, 2, 2] and not c6_verdict.uneven_split(n, k)


def test_c6_reweighting_of_an_uneven_split():
    w = c6_verdict.reweighting(127, 2)
    assert w["chunks"] == [64, 63]
    assert w["relative_weight"] == pytest.approx([127 / 128 - 1, 127 / 126 - 1])
    assert c6_verdict.reweighting(3, 2)["max_abs"] == pytest.approx(0.5)   # the article's [0.3, 0.2, 0.8]
    assert c6_verdict.reweighting(128, 2)["max_abs"] == 0.0


def test_c6_interval_excluding_zero_confirms(tmp_path):
    f = c6_text.finding(evidence(tmp_path, gpu_tag(c6={"mean_shift": 0.05, "noise": 0.005})))
    t = f.data["training"][0]
    ci = t["intervals"]["dp_mean-dp_sum"]["final_loss"]
    assert ci["n"] == 3 and ci["lo"] > 0
    # the interval is Student's t over the paired (same seed) differences
    from scipy import stats
    diffs = [0.05 + 0.005 * ((-1) ** r) * (1 + r / 3) - 1e-4 * (r - 1) for r in range(3)]
    expect = stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert (ci["lo"], ci["hi"]) == pytest.approx(expect)
    assert t["seeds"] == ["100", "101", "102"] and t["deterministic"]
    # single's final loss over the seeds: 1.80, 1.85, 1.90, sd 0.05; the effect is about its size
    assert t["practical"]["share_lo"] == pytest.approx(ci["lo"] / 0.05) and t["practical"]["negligible"] is False
    assert f.verdict == CONFIRMED and t["practical"]["share"] == pytest.approx(ci["mean"] / 0.05)


def test_c6_measurable_but_far_below_the_seed_to_seed_spread_is_negligible(tmp_path):
    # +0.005 told apart from zero (the seeds agree to 0.0003), but changing the seed moves the
    # final loss by 0.05: the whole interval lies within a quarter of that
    f = c6_text.finding(evidence(tmp_path, gpu_tag(c6={"mean_shift": 0.005, "noise": 0.0002})))
    t = f.data["training"][0]
    ci = t["intervals"]["dp_mean-dp_sum"]["final_loss"]
    assert ci["lo"] > 0 and max(abs(ci["lo"]), abs(ci["hi"])) < c6_verdict.NEGLIGIBLE * 0.05
    assert t["practical"]["negligible"] is True
    assert f.verdict == NUANCE


def test_c6_measurable_with_no_seed_to_seed_spread_is_not_confirmed(tmp_path, monkeypatch):
    """Told apart from zero, but with nothing to weigh its size against (single's spread over
    seeds unknown), the effect's size in practice is unknown: needs nuance, not confirmed."""
    real = c6_verdict.practical_size
    monkeypatch.setattr(c6_verdict, "practical_size", lambda loss, sd: real(loss, math.nan))
    f = c6_text.finding(evidence(tmp_path, gpu_tag(c6={"mean_shift": 0.05, "noise": 0.005})))
    assert f.data["training"][0]["practical"]["negligible"] is None
    assert f.verdict == NUANCE and f.data["training"][0]["intervals"]["dp_mean-dp_sum"]["final_loss"]["lo"] > 0


def test_c6_interval_including_zero_needs_nuance(tmp_path):
    f = c6_text.finding(evidence(tmp_path, gpu_tag(c6={"mean_shift": 0.001, "noise": 0.02})))
    ci = f.data["training"][0]["intervals"]["dp_mean-dp_sum"]["final_loss"]
    assert ci["lo"] < 0 < ci["hi"]
    assert f.verdict == NUANCE
    assert f.data["training"][0]["reweighting"]["max_abs"] == pytest.approx(0.0079, abs=5e-5)
