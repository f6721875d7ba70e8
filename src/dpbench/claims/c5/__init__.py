"""C5, the gather warning for scalar losses: the probe and its text (the probe's verdict, with the runs' warnings)."""
