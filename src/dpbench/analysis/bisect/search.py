"""The bisection and the judgement of one step.

A step is one paired launch of the last environment known good (base) against the midpoint
(cand), each watched cell judged by the within-launch test (analysis.compare.paired: a pooled
t-test on log samples/s), Holm's correction over the watched cells, at the rule's alpha, fixed
before anything runs. The launch's mean change over the cells is reported, not decided on. A
step is

- bad: a cell is slower (p after Holm < alpha);
- good: no cell is slower, and every cell is shown not slower by more than `margin` (a one-sided
  non-inferiority bound at alpha: the change's lower confidence bound above -margin; with every
  cell required to pass, the chance of calling a slower-by-margin step good is at most alpha);
- inconclusive: neither (the change is under what the step could detect, and the step cannot
  rule out a slowdown of `margin`). The step says how many more runs a side would settle it,
  from the observed sd: the fewest with which either the observed change is detected, or the
  bound clears the margin, at the rule's power. The bisection stops there instead of guessing.

The search keeps (last good, first bad): it starts from the ends as given, halves the range on
every step, and names the first bad environment only once a step has seen it slower; when the
range has closed on the bad end without seeing it slower, a last step tests that end itself (so
an ordered list with nothing slower names none). With the first bad at position k of 8
(0 the good end), the steps are 3 (2 for k = 1; 4 for k = 7 and when nothing is slower).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import scipy.stats

from dpbench.analysis.compare.curves import POWER
from dpbench.analysis.compare.paired import detectable_log, paired_logs
from dpbench.analysis.compare.stats import holm

BAD, GOOD, INCONCLUSIVE = "bad", "good", "inconclusive"
SLOWER, NOT_SLOWER, UNDECIDED, NO_RUNS = "slower", "not slower", "inconclusive", "no runs"
MAX_RUNS = 1000   # a step that would need more runs a side than this is not settled by runs


@dataclass(frozen=True)
class Rule:
    """The decision rule of every step, fixed before the bisection starts."""
    alpha: float = 0.01
    """A step's false-alarm rate: the chance that a step with nothing slower is called bad
    (Holm over the watched cells)."""
    margin: float = 0.01
    """A step is good only when every cell is shown not slower by more than this (relative)."""
    power: float = POWER
    """The power at which the smallest detectable change and the runs to settle are quoted."""

    def __post_init__(self):
        if not 0 < self.alpha <= 0.01:
            raise ValueError(f"alpha {self.alpha}: a bisection step's false-alarm rate is at most 0.01 "
                             "(several steps make one bisection)")
        if not 0 < self.margin < 1:
            raise ValueError(f"margin {self.margin}: a relative change between 0 and 1 (0.01 is 1%)")


RULE = Rule()


@dataclass
class CellJudgement:
    cell: Hashable
    n_base: int
    n_cand: int
    change: float | None
    """The candidate's geometric mean samples/s over the base's, minus 1."""
    p_holm: float | None
    smallest_detectable: float | None
    """The relative change this step's test finds at the rule's power (Holm's first level)."""
    lower_bound: float | None
    """The one-sided (1 - alpha) lower confidence bound of the change."""
    verdict: str
    """slower, not slower (within the margin), inconclusive, or no runs."""
    sd_log: float | None = None
    more_runs: int | None = None
    """For an inconclusive cell: runs a side to add (beyond n_base) that would settle it."""


@dataclass
class StepJudgement:
    verdict: str
    cells: list[CellJudgement]
    launch: dict[str, Any]
    rule: Rule
    more_runs: int | None = None
    """For an inconclusive step: the most any of its cells needs (runs a side to add)."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for c in d["cells"]:
            c["cell"] = list(c["cell"]) if isinstance(c["cell"], tuple) else c["cell"]
        return d


def _lower_bound(d: float, se: float, df: int, alpha: float) -> float:
    """The one-sided (1 - alpha) lower bound of a log change d with standard error se."""
    return d if se == 0.0 else d - float(scipy.stats.t.ppf(1 - alpha, df)) * se


def runs_to_settle(sd: float, d: float, n: int, tests: int, rule: Rule) -> int | None:
    """Runs a side (in all, >= n) at which a cell with log sd `sd` and observed log change `d`
    would be settled at the rule's power: the change detected as slower (two-sided, Holm's first
    level over `tests` tests), or the lower bound clearing the margin; None beyond MAX_RUNS."""
    t = scipy.stats.t
    room = d - math.log1p(-rule.margin)   # how far the change sits above -margin (log)

    def settled(m: int) -> bool:   # both criteria only get easier with more runs
        se, df = sd * math.sqrt(2 / m), 2 * m - 2
        detected = d < 0 and detectable_log(se, df, rule.alpha / tests) <= -d
        return detected or (room > 0 and (t.ppf(1 - rule.alpha, df) + t.ppf(rule.power, df)) * se <= room)

    lo, hi = max(n, 2), MAX_RUNS
    if not settled(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settled(mid) else (mid + 1, hi)
    return lo


def judge_logs(logs: dict[Hashable, tuple[np.ndarray, np.ndarray]], rule: Rule = RULE) -> StepJudgement:
    """One step from cell -> (base's, candidate's) log samples/s of its watched cells."""
    logs = {k: (np.asarray(b, float), np.asarray(c, float)) for k, (b, c) in logs.items()}
    verdict = paired_logs(logs, rule.alpha)   # its per-cell t-tests; Holm here over the cells alone
    adjusted = dict(zip([r.cell for r in verdict.cells], holm([r.p for r in verdict.cells])))
    tests = max(1, sum(q is not None for q in adjusted.values()))
    tested = {r.cell: r for r in verdict.cells}
    cells = []
    for k, (b, c) in logs.items():
        r = tested.get(k)
        if r is None:   # a side without runs (they failed, or were not made)
            cells.append(CellJudgement(k, len(b), len(c), None, None, None, None, NO_RUNS))
            continue
        d = math.log1p(r.change)
        if r.sd_log is None:   # one run a side: no spread to judge by
            cells.append(CellJudgement(k, r.n_base, r.n_cand, r.change, None, None, None, UNDECIDED,
                                       more_runs=2 - min(r.n_base, r.n_cand)))
            continue
        se = r.sd_log * math.sqrt(1 / r.n_base + 1 / r.n_cand)
        lower = _lower_bound(d, se, r.df, rule.alpha)
        slower = adjusted[k] is not None and adjusted[k] < rule.alpha and d < 0
        within = lower > math.log1p(-rule.margin)
        state = SLOWER if slower else NOT_SLOWER if within else UNDECIDED
        more = None
        if state == UNDECIDED:
            needed = runs_to_settle(r.sd_log, d, min(r.n_base, r.n_cand), tests, rule)
            more = None if needed is None else needed - min(r.n_base, r.n_cand)
        detectable = math.expm1(detectable_log(se, r.df, rule.alpha / tests)) if se > 0 else 0.0
        cells.append(CellJudgement(k, r.n_base, r.n_cand, r.change, adjusted[k], detectable,
                                   math.expm1(lower), state, r.sd_log, more))
    launch = asdict(verdict.launch)   # information: the mean change over the cells
    if any(c.verdict == SLOWER for c in cells):
        step = BAD
    elif cells and all(c.verdict == NOT_SLOWER for c in cells):
        step = GOOD
    else:
        step = INCONCLUSIVE
    more = None
    if step == INCONCLUSIVE:
        wants = [c.more_runs for c in cells if c.verdict in (UNDECIDED, NO_RUNS)]
        more = None if not wants or None in wants else max(wants)
    return StepJudgement(step, cells, launch, rule, more)


@dataclass
class Step:
    number: int
    base: int
    cand: int
    judgement: StepJudgement


@dataclass
class BisectResult:
    status: str
    """found (first_bad names it), none (the bad end is not slower than the last good), or
    inconclusive (a step could not tell; last_good and first_bad bound what is left)."""
    first_bad: int | None
    last_good: int
    steps: list[Step]
    open_range: tuple[int, int] | None = None
    """For an inconclusive bisection: (last good, the end of what is left): the first bad, if
    any, is after the first and at or before the second."""


def bisect(n: int, judge: Callable[[int, int], StepJudgement], good: int = 0, bad: int | None = None) -> BisectResult:
    """Bisect environments good..bad (indices into an ordered list of n): judge(base, cand) is one
    step. The first bad is named only where a step saw it slower than the last good."""
    bad = n - 1 if bad is None else bad
    if not 0 <= good < bad < n:
        raise ValueError(f"good {good} and bad {bad}: need 0 <= good < bad < {n}")
    lo, hi, seen_bad, steps = good, bad, False, []
    while True:
        if hi - lo <= 1 and seen_bad:
            return BisectResult("found", hi, lo, steps)
        mid = (lo + hi) // 2 if hi - lo > 1 else hi   # the bad end itself, never seen slower yet
        j = judge(lo, mid)
        steps.append(Step(len(steps) + 1, lo, mid, j))
        if j.verdict == BAD:
            hi, seen_bad = mid, True
        elif j.verdict == GOOD:
            lo = mid
            if lo == hi:
                return BisectResult("none", None, lo, steps)
        else:
            return BisectResult("inconclusive", None, lo, steps, (lo, hi))
