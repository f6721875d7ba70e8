"""C4, saving and loading a DataParallel model: the probe and its text (the probe's verdict stands)."""
