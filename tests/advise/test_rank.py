"""advise.rank's speed rule and the host-bound probe: a probe whose step barely grows with its
batch makes the samples/s upper bounds, and the recommendation says so (ResNet18 on one H200:
7.2 ms at batch 32, 8.7 ms at 128; its samples/s came out 2.6x the measured)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dpbench.advise.predict import ProbeFacts
from dpbench.advise.rank import SCALING_SHARE, scaling_share
from dpbench.advise.recommend import advise


def facts(step_s: tuple[float, float], batches: tuple[int, int] = (32, 128)) -> ProbeFacts:
    return ProbeFacts(workload="w", parameters=11_000_000, param_bytes=4.0, largest_unit_bytes=4.0e6, batches=batches,
                      activation_mib=(300.0, 1200.0), fixed_mib=50.0, step_extra_mib=40.0,
                      reserved_extra_mib=200.0, context_mib=500.0, step_s=step_s, device="cuda")


def test_the_share_of_the_step_that_grows_with_the_batch():
    assert scaling_share(facts((0.0072, 0.0087))) == pytest.approx((0.0015 / 96) * 128 / 0.0087)
    assert scaling_share(facts((0.0505, 0.1421), (2, 8))) == pytest.approx(0.86, abs=0.01)   # the 1.07B LM
    assert scaling_share(replace(facts((0.0, 0.0)), step_s=())) is None


@pytest.mark.parametrize("steps, flagged", [((0.0072, 0.0087), True), ((0.010, 0.040), False)])
def test_a_host_bound_probe_makes_the_speeds_upper_bounds(steps, flagged):
    a = advise(facts(steps), gpus=1, gpu_memory_gib=24)
    assert (a.scaling_share < SCALING_SHARE) is flagged
    assert ("upper bounds" in a.sentence) is flagged
