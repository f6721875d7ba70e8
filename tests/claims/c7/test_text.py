"""C7's ledger line."""


from dpbench.claims import CONFIRMED
from dpbench.claims.c7 import text as c7_text
from dpbench.claims.records import obs

from claims.planted import _probe


def test_c7_ledger_line_gives_the_conv_slowdowns_intervals_where_recorded():
    old = _probe("C7", CONFIRMED, [obs("c7.conv.slowdown", "s", benchmark_on=65.7, benchmark_off=3.9)])
    assert c7_text._c7_summary(old).endswith("65.7x slower with benchmark on, 3.9x off")
    new = _probe("C7", CONFIRMED, [obs("c7.conv.slowdown", "s", benchmark_on=65.7, benchmark_off=3.9,
                                  benchmark_on_low=60.1, benchmark_on_high=70.2, benchmark_off_low=3.5,
                                  benchmark_off_high=4.4, level=0.957)])
    assert c7_text._c7_summary(new).endswith(
        "65.7x (60.1-70.2x) slower with benchmark on, 3.9x (3.5-4.4x) off, intervals at >= 96% confidence")
