"""C6, the mean of per-GPU means on uneven splits: the probe, the training runs' verdict, its text and figure."""
