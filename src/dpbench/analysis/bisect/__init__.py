"""Which environment of an ordered list (successive PyTorch installs) first made a cell slower:
the bisection over paired launches (search), each step judged by the within-launch paired test
at a false-alarm rate fixed in advance, and the profiled steps' differences (where the time
went). Numbers only, torch-free: dpbench.bisect_cli runs the launches, report.bisect_report words
them."""
from dpbench.analysis.bisect.search import (RULE, BisectResult, Rule, Step, StepJudgement, bisect,
                                            judge_logs)

__all__ = ["RULE", "BisectResult", "Rule", "Step", "StepJudgement", "bisect", "judge_logs"]
