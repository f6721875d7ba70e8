"""C1 attribution check on a GPU: the replayed peak against max_memory_allocated, width after
width in one process (as the probe runs them).   PYTHONPATH=src python3 tools/device/c1_attribution_check.py"""
import torch
from dpbench.claims.c1 import attribution as att
devs = [torch.device("cuda", 0)]
for classes in (10, 32768):
    torch.cuda.reset_peak_memory_stats()
    r = att.attribute("single", classes, 2048, devs)["0"]
    print(classes, "replayed", r["peak_mib"], "max_memory_allocated", round(torch.cuda.max_memory_allocated() / 2**20, 1), r["by_category"])
