"""One training run: the only place torch runs (the launcher itself stays torch-free), from the
engine's training step to the record it leaves."""
