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
    bad = [search.judge_logs(logs(rng, {"a": 0.0, "b": 0.0}, sd=0.01)).verdict == BAD for _ in range(800)]
    assert np.mean(bad) <= 0.01 + 3 * math.sqrt(0.01 * 0.99 / 800)
