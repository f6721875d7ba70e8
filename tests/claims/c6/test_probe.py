"""C6's probe: the article's arithmetic and its CPU emulation."""

import torch
import torch.nn as nn

from dpbench.claims.c6 import probe as c6_probe


def _small_bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).eval()


def test_c6_article_arithmetic_exactly():
    a = c6_probe.article_arithmetic()
    assert a["split"] == [2, 1]
    assert a["one device mean"]["value"] == a["sum / N"]["value"] == 0.4333
    assert a["mean of per-device means"]["value"] == 0.525
    assert a["mean of per-device means"]["per_sample_weights"] == [0.25, 0.25, 0.5]


def test_c6_cpu_emulation_uneven_split_biases_mean_of_means_only():
    x, y = c6_probe._batch(10)
    e = c6_probe.emulate(_small_bn_net(), x, y, 3)
    assert e["chunks"] == [4, 4, 2]
    assert abs(e["loss_sum_over_n"] - e["loss_full_mean"]) < 1e-6
    assert e["grad_rel_diff_sum_over_n"] < 1e-5 < 1e-3 < e["grad_rel_diff_mean_of_means"]
    assert c6_probe.biased(e["grad_rel_diff_mean_of_means"], e["grad_rel_diff_sum_over_n"])
