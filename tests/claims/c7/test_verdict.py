"""C7's verdict over planted runs."""

import pytest

from dpbench.claims import CONFIRMED, NUANCE, REFUTED
from dpbench.claims.c7 import text as c7_text
from dpbench.claims.c7 import verdict as c7_verdict
from dpbench.plan.matrix import read_plan

from claims.planted import PLANNED, gpu_tag, evidence


def test_the_cudnn_benchmark_group_has_its_off_leg():
    class Ev:
        groups = read_plan(PLANNED)
    assert c7_verdict._twin(Ev, "c7_benchmark_on", "cudnn_benchmark") == "c8_fp32_b512"


@pytest.mark.parametrize("on_ms, verdict", [(725.0, CONFIRMED), (60.0, NUANCE), (45.0, REFUTED)])
def test_c7_verdict_follows_step_times_against_its_off_leg(tmp_path, on_ms, verdict):
    f = c7_text.finding(evidence(tmp_path, gpu_tag(c7={"dp_on_ms": on_ms})))
    assert f.verdict == verdict
    dp = next(t for t in f.data["training"] if t["variant"] == "dp")
    assert dp["off_group"] == "c8_fp32_b512" and dp["repeats"] == 2


def test_c7_advice_names_the_threads_when_persistent_threads_escape_it(tmp_path):
    f = c7_text.finding(evidence(tmp_path, gpu_tag()))
    on = f.data["dp_step"]["on"]   # the advice in words: the C7 snapshot of tests/claims/test_text.py
    assert on["threads_are_the_cost"] and (on["dp_ms"], on["dp_persistent_ms"]) == (725.0, 20.0)
