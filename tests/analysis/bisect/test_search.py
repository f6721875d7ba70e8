"""The bisection's logic with a fake judge, and one step's judgement on made-up log samples/s
(fast: no launch)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpbench.analysis.bisect import search
from dpbench.analysis.bisect.search import BAD, GOOD, INCONCLUSIVE, Rule, StepJudgement


def fake_judge(first_bad: int | None, undecided: set[int] = frozenset()):
    """A judge that knows the answer: cand is bad when at or after first_bad (and base before)."""
    calls = []

    def judge(base: int, cand: int) -> StepJudgement:
        calls.append((base, cand))
        assert first_bad is None or base < first_bad, "a base is always a known good"
        verdict = INCONCLUSIVE if cand in undecided else \
            BAD if first_bad is not None and cand >= first_bad else GOOD
        return StepJudgement(verdict, [], {}, search.RULE, 3 if verdict == INCONCLUSIVE else None)

    return judge, calls


@pytest.mark.parametrize("k", range(1, 8))
def test_names_the_first_bad_of_eight_in_three_steps_or_so(k):
    judge, calls = fake_judge(k)
    res = search.bisect(8, judge)
    assert (res.status, res.first_bad, res.last_good) == ("found", k, k - 1)
    # k = 7: the range closes on the bad end unseen, so a fourth step tests it
    assert len(res.steps) == {1: 2, 7: 4}.get(k, 3) and [(s.base, s.cand) for s in res.steps] == calls


def test_the_fifth_of_eight_by_the_steps_a_user_would_expect():
    judge, calls = fake_judge(4)
    assert search.bisect(8, judge).first_bad == 4
    assert calls == [(0, 3), (3, 5), (3, 4)]


def test_nothing_slower_names_none_after_testing_the_bad_end_itself():
    judge, calls = fake_judge(None)
    res = search.bisect(8, judge)
    assert (res.status, res.first_bad, res.last_good) == ("none", None, 7)
    assert calls == [(0, 3), (3, 5), (5, 6), (6, 7)]


def test_an_inconclusive_step_stops_the_search_with_what_is_left():
    judge, calls = fake_judge(4, undecided={5})
    res = search.bisect(8, judge)
    assert (res.status, res.first_bad, res.open_range) == ("inconclusive", None, (3, 7))
    assert calls == [(0, 3), (3, 5)] and res.steps[-1].judgement.more_runs == 3


def test_ends_other_than_first_and_last():
    judge, calls = fake_judge(3)
    res = search.bisect(8, judge, good=2, bad=5)
    assert res.first_bad == 3 and calls[0] == (2, 3)
    with pytest.raises(ValueError):
        search.bisect(8, judge, good=5, bad=5)


def test_the_rule_refuses_a_step_alpha_above_one_percent():
    with pytest.raises(ValueError):
        Rule(alpha=0.05)


def logs(rng, changes: dict, n: int = 3, sd: float = 0.002) -> dict:
    return {cell: (rng.normal(0, sd, n), rng.normal(math.log1p(ch), sd, n)) for cell, ch in changes.items()}


def test_a_step_with_one_cell_two_percent_slower_is_bad_and_names_the_cell():
    rng = np.random.default_rng(1)
    j = search.judge_logs(logs(rng, {"single": 0.0, "ddp": -0.02}))
    assert j.verdict == BAD
    by = {c.cell: c for c in j.cells}
    assert by["ddp"].verdict == "slower" and by["single"].verdict == "not slower"
    assert by["ddp"].smallest_detectable < 0.02 and by["ddp"].p_holm < 0.01


def test_a_step_with_nothing_slower_and_little_noise_is_good():
    j = search.judge_logs(logs(np.random.default_rng(2), {"single": 0.0, "ddp": 0.0}))
    assert j.verdict == GOOD and all(c.lower_bound > -0.01 for c in j.cells)


def test_a_noisy_step_is_inconclusive_and_says_how_many_runs_would_settle_it():
    j = search.judge_logs(logs(np.random.default_rng(3), {"single": 0.0}, sd=0.02))
    (cell,) = j.cells
    assert j.verdict == INCONCLUSIVE and cell.verdict == "inconclusive"
    assert cell.smallest_detectable > 0.01 and j.more_runs is not None and j.more_runs > 0
    # With that many more runs a side at the observed sd, the observed change is detected or the
    # margin cleared, at the rule's power; with one fewer, neither.
    def settled(n: int) -> bool:
        t, df = __import__("scipy").stats.t, 2 * n - 2
        se, d = cell.sd_log * math.sqrt(2 / n), math.log1p(cell.change)
        detected = d < 0 and (t.ppf(1 - 0.01 / 2, df) + t.ppf(0.8, df)) * se <= -d
        cleared = (t.ppf(0.99, df) + t.ppf(0.8, df)) * se <= d - math.log1p(-0.01)
        return detected or cleared
    assert settled(3 + j.more_runs) and not settled(3 + j.more_runs - 1)


def test_a_cell_without_runs_on_one_side_is_inconclusive_not_good():
    rng = np.random.default_rng(4)
    cells = logs(rng, {"single": 0.0})
    cells["ddp"] = (rng.normal(0, 0.002, 3), np.array([]))
    j = search.judge_logs(cells)
    assert j.verdict == INCONCLUSIVE and {c.cell: c.verdict for c in j.cells}["ddp"] == "no runs"


def test_a_step_false_alarm_rate_is_at_most_its_alpha():
    rng = np.random.default_rng(5)
    bad = [search.judge_logs(logs(rng, {"a": 0.0, "b": 0.0}, sd=0.01)).verdict == BAD for _ in range(300)]
    assert np.mean(bad) <= 0.01 + 3 * math.sqrt(0.01 * 0.99 / 300)


# -- where the time went, the report, the command line's inputs ----------------------------------

def profile_doc(forward, backward, optimizer, kernels, exposed=0.0):
    return {"phases_ms": {"forward": forward, "backward": backward, "optimizer": optimizer},
            "step_ms": forward + backward + optimizer, "exposed_comm_ms": exposed, "kernels_ms": kernels,
            "device": "cuda"}


def test_where_the_time_went_names_the_phase_and_the_kernels_that_moved():
    from dpbench.analysis.bisect import profile
    good = profile_doc(5.0, 10.0, 2.0, {"conv": 8.0, "gemm": 3.0, "sgd": 1.0})
    bad = profile_doc(5.1, 10.0, 2.5, {"conv": 8.05, "gemm": 3.0, "sgd": 1.0, "sleep": 0.46}, exposed=0.1)
    w = profile.where_the_time_went({"e3": good, "e4": bad}, ["e3", "e4"], "e3", "e4", ["ddp", 1, ""])
    assert w["grew_most"] == "optimizer" and w["change_ms"]["optimizer"] == pytest.approx(0.5)
    assert [k["name"] for k in w["kernels"][:2]] == ["sleep", "conv"] and w["kernels"][0]["good_ms"] == 0.0
    assert [r["environment"] for r in w["phases"]] == ["e3", "e4"]


def test_exposed_communication_is_what_no_computation_overlaps():
    from dpbench.run.intervals import exposed
    assert exposed([(0, 10), (5, 12), (20, 25)], [(2, 4), (8, 21)]) == pytest.approx(17 - (2 + 4 + 1))
    assert exposed([], [(0, 1)]) == 0.0


def test_the_report_words_every_outcome():
    from dpbench.report import bisect_report
    envs = [{"index": i, "name": f"e{i}", "python": f"/p{i}", "torch": "2.14.1"} for i in range(8)]
    cell = {"cell": ["single", 1, ""], "n_base": 3, "n_cand": 3, "change": -0.02, "p_holm": 0.001,
            "smallest_detectable": 0.006, "lower_bound": -0.03, "verdict": "slower", "more_runs": None}
    step = {"number": 1, "base": 0, "cand": 3, "tag": "bisect-x-e0-e3", "seconds": 60.0, "verdict": "bad",
            "cells": [cell], "more_runs": None}
    doc = {"name": "x", "experiment": "upgrade", "variants": ["single"], "gpus": [1], "repeats": 3,
           "rule": {"alpha": 0.01, "margin": 0.01, "power": 0.8}, "environments": envs, "good": 0, "bad": 7,
           "result": {"status": "found", "first_bad": 3, "last_good": 2, "open_range": None}, "steps": [step],
           "seconds": 200.0, "provenance": [{"key": "nccl", "good": "2.27", "bad": "2.28", "differs": True}]}
    md = bisect_report.markdown(doc)
    assert "first bad: e3" in md and "**differs**" in md and "| 1 | e0 | e3 | single g1 | 3/3 | -2.00%" in md
    doc["result"] = {"status": "inconclusive", "first_bad": None, "last_good": 0, "open_range": [0, 7]}
    doc["steps"] = [{**step, "verdict": "inconclusive", "more_runs": 4}]
    assert "4 more run(s) a side" in bisect_report.summary_line(doc)
    doc["result"] = {"status": "none", "first_bad": None, "last_good": 7, "open_range": None}
    assert bisect_report.summary_line(doc).startswith("none: e7")


def test_environments_from_a_file_and_the_command_line(tmp_path):
    from dpbench.bisect_cli import BisectError, parse_envs, position
    f = tmp_path / "envs.txt"
    f.write_text("# releases in order\nv29 /venvs/2.9/bin/python\n/venvs/2.10/bin/python\n")
    got = parse_envs(["v211=/venvs/2.11/bin/python"], f)
    assert [(e.name, e.python) for e in got] == [("v29", "/venvs/2.9/bin/python"), ("e1", "/venvs/2.10/bin/python"),
                                                 ("v211", "/venvs/2.11/bin/python")]
    assert position("-1", got) == 2 and position("v29", got) == 0
    with pytest.raises(BisectError):
        parse_envs(["a=/x", "a=/y"], None)
    with pytest.raises(BisectError):
        position("9", got)
