"""C3, wrapping the optimizer in DataParallel: the probe and its text (the probe's verdict stands)."""
