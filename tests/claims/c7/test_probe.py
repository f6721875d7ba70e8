"""C7's probe: the conv verdict by its ratio interval, the step breakdown per batch."""

import pytest

from dpbench.claims import CONFIRMED, NUANCE, REFUTED, records
from dpbench.claims.c7 import probe as c7_probe

from claims.planted import dp_step_observations


SAME = [10.0 + 0.1 * i for i in range(10)]   # a same-thread conv step, 10.0-10.9 ms


NOISY = [8.0, 9.0, 12.0, 14.0, 16.0, 17.0, 18.0, 25.0, 30.0, 40.0]   # median 16.5: 1.58x SAME's


def run_c7(monkeypatch, new_on, new_off=SAME, gpus=1, dp_steps=()):
    """The C7 probe on planted per-step conv times (and, with 2 GPUs, a planted step breakdown)."""
    ms = {(True, True): new_on, (True, False): SAME, (False, True): new_off, (False, False): SAME}
    monkeypatch.setattr(c7_probe, "gpus_visible", lambda: gpus)
    monkeypatch.setattr(c7_probe, "time_ms", lambda b, t: list(ms[b, t]))
    monkeypatch.setattr(c7_probe, "dp_step_observations", lambda n, batches: (list(dp_steps), []))
    return c7_probe.run(batches=[512, 8192])


@pytest.mark.parametrize("new_on, new_off, verdict", [
    ([600.0 + i for i in range(10)], SAME, CONFIRMED),                # 60x, far beyond the steps' spread
    (NOISY, SAME, NUANCE),                                            # median ratio past 1.5, interval straddles it
    ([v * 0.9 for v in NOISY], SAME, NUANCE),                         # median ratio under 1.5, interval straddles it
    ([v + 0.05 for v in SAME], SAME, REFUTED),                        # no slowdown
    ([600.0 + i for i in range(10)], [200.0, 210.0, 220.0, 290.0, 300.0, 310.0, 320.0, 500.0, 600.0, 700.0],
     NUANCE),                                                         # benchmark off maybe nearly as slow
])
def test_c7_conv_verdict_is_called_only_where_the_ratio_interval_clears_slow(monkeypatch, new_on, new_off, verdict):
    rec = run_c7(monkeypatch, new_on, new_off)
    r = rec.values("c7.conv.slowdown")
    assert rec.verdict == verdict
    assert r["benchmark_on_low"] <= r["benchmark_on"] <= r["benchmark_on_high"]
    assert r["benchmark_off_low"] <= r["benchmark_off"] <= r["benchmark_off_high"]
    assert 0.95 <= r["level"] < 1
    if verdict == NUANCE:   # a call on the medians alone would have been made here
        assert (r["benchmark_on_low"] <= c7_probe.SLOW < r["benchmark_on_high"]
                or r["benchmark_on_low"] <= c7_probe.SLOW * r["benchmark_off_high"])
    assert rec.values("c7.conv.bench_on.new_thread")["steps_ms"] == [round(v, 3) for v in new_on]


def test_c7_verdict_without_an_interval_calls_nothing():
    none = c7_probe.Estimate(64.0, float("nan"), float("nan"), float("nan"))
    assert c7_probe.verdict_from(none, none) == NUANCE


def test_c7_persistent_threads_must_surely_escape(monkeypatch):
    def verdict(stock_on, persistent_on, spread):
        steps = dp_step_observations(stock_on=stock_on, persistent_on=persistent_on, spread=spread)
        return run_c7(monkeypatch, [600.0 + i for i in range(10)], gpus=2, dp_steps=steps).verdict

    assert verdict(725.0, 20.0, 0.03) == CONFIRMED   # persistent threads escape the slowdown
    assert verdict(32.0, 20.0, 0.1) == NUANCE        # 1.6x on the medians, but the ranges come within 1.5x
    assert verdict(25.0, 20.0, 0.03) == NUANCE       # no escape at all


def test_c7_probe_breaks_the_step_down_at_each_batch_it_is_given(monkeypatch):
    calls = []

    def run_python(code, env=None, args=None):
        calls.append(args[args.index("--benchmark") + 1:])
        return {"rc": 1, "stderr_tail": ["no GPU here"]}

    monkeypatch.setattr(c7_probe, "run_python", run_python)
    obs_, parts = c7_probe.dp_step_observations(2, [512, 8192])
    assert calls == [["off", "--batch", "512"], ["on", "--batch", "512"], ["off", "--batch", "8192"]]
    assert [o.id for o in obs_] == [records.dp_step_id(f, b, "failed") for f, b in (("off", 512), ("on", 512),
                                                                                     ("off", 8192))]
    assert parts[-1] == "DataParallel step breakdown, batch 8192 on 2 GPUs, cudnn.benchmark off: failed (exit code 1)"
