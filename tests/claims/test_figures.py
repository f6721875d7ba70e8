"""The ledger's figures: those the plots draw, and its own planned."""


from dpbench import results
from dpbench.claims.figures import DRAW
from dpbench.claims.ledger import FIGURES


def test_ledger_figures_are_figures_the_plots_draw_and_its_own_are_planned():
    assert {name for names in FIGURES.values() for name in names} <= set(results.FIGURE_NAMES)
    assert tuple(DRAW) == results.CLAIM_FIGURE_KEYS
