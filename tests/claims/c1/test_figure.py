"""C1's figure."""


from dpbench.claims.figures import DRAW

from claims.planted import fake_gpu_probes, gpu_tag, ledger


def test_c1_figure_gives_the_ratio_its_own_axis(tmp_path):
    # MiB on a symlog axis and a ratio near 1 shared one y axis once: the ratio had no ticks
    _, claims = ledger(tmp_path, gpu_tag(), fake_gpu_probes())
    left, right = DRAW["C1"](claims["C1"]).axes[:2]
    assert left.get_yscale() == "symlog" and right.get_yscale() == "linear"
    lo, hi = right.get_ylim()
    assert 0.9 < lo < 1.0 and 1.1 < hi < 1.3   # the planted dp ratios: 1.02 to 1.19
