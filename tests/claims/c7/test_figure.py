"""C7's figure."""

import pytest



@pytest.mark.parametrize("dp_on_ms, log", [(725.0, True), (23.3, False)])
def test_c7_figure_uses_a_log_axis_only_for_times_a_decade_apart_and_bars_start_low(dp_on_ms, log):
    from dpbench.claims.c7.figure import c7_figure
    training = [{"variant": "single", "gpus": 1, "p50_on_ms": 23.3, "p50_off_ms": 23.5},
                {"variant": "dp", "gpus": 2, "p50_on_ms": dp_on_ms, "p50_off_ms": 45.0}]
    fig = c7_figure({"data": {"training": training}})
    ax = fig.axes[0]
    assert (ax.get_yscale() == "log") is log and ("log scale" in fig._suptitle.get_text()) is log
    bottom = ax.get_ylim()[0]
    assert bottom <= 23.3 / 10 if log else bottom == 0   # the bars' heights mean something
