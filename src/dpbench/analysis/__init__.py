"""Numbers only: tidy tables from the records, cells and their statistics, the noise between
launches, the regression check's detectors, the perf targets. No prose, no matplotlib."""
