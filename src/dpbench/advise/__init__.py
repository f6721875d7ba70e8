"""`dpbench advise`: which data-parallel setup for a workload on N GPUs of a given memory,
predicted from the memory model and a short measured probe, ranked, recommended, and checked."""
