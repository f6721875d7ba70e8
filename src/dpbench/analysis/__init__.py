"""Numbers only: tidy tables from the records, cells and their statistics, the noise between
launches, the regression check's detectors. No prose, no matplotlib."""
