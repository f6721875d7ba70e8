"""Every knob of the comparison with its default (experiments/schema.yaml mirrors them), and
the kinds of finding --fail-on can name."""
from __future__ import annotations

from dataclasses import dataclass

FAIL_ON = ("regressions", "new-warnings", "diverged-curves", "findings")


@dataclass(frozen=True)
class Thresholds:
    """Every knob of the comparison, with its default: the one source (schema.yaml mirrors it)."""

    # About what a user would act on. Without A/A data the noise floor below decides; with it
    # (--noise-from) a cell's own departure from the other cells is resolved to ~0.5% on
    # one H200, so this is what then stops verdicts on changes nobody would act on.
    threshold: float = 0.02
    """Smallest relative throughput change worth a verdict."""
    # Day-to-day noise between launches, which repeats of one launch cannot see: on 2x H200 the
    # same cells rerun a day later moved by +0.4%, +0.6% and +4.1% while repeats within each
    # launch agreed far closer (single GPU: 0.04%). 5% sits above the largest such shift.
    noise_floor: float = 0.05
    """Relative throughput change that two launches of the same code can show (A/A)."""
    # 3 vs 3 repeats: the relative SE of a difference of means is about 0.8 CV, so 2 CV ~ 2.5 SE.
    k_spread: float = 2.0
    """A throughput change must also exceed this many pooled coefficients of variation."""
    alpha: float = 0.05
    """Family-wise error rate per aspect (Holm over the cells)."""
    mem_threshold_mib: float = 64.0
    mem_threshold_pct: float = 5.0
    loss_tolerance: float = 1e-3
    """Absolute loss difference that never counts (the narrowest curve band)."""
    # Simulated A/A pairs of 3 vs 3 repeats, modelled on the 2x H200 reference's repeats (a
    # per-run level that persists over the whole run, as chaotic early training leaves, plus
    # per-step noise; or a slow random drift) leave a 3 SE band on more than 30% of the steps in
    # at most ~4% of the pairs; a shift of 3 run-to-run sd is found in 86-99% of them.
    envelope_k: float = 3.0
    """Half-width of the per-step band in standard errors of the difference of mean curves."""
    envelope_fraction: float = 0.3
    """Share of the steps outside the band that calls a curve diverged."""

