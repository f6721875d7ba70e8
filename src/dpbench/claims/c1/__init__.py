"""C1, DP's first GPU uses more memory: the probe (batch search, memory snapshots), the verdict, its text and figure."""
