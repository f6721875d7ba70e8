"""Experiment to runs, without torch: the config and its schema, the run matrix, the skip rule, and
what the Snakefile asks of them."""
