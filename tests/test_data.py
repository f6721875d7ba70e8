import pickle
import urllib.error

import numpy as np
import pytest
import torch

from dpbench import data
from dpbench.model import resnet18

from conftest import write_official_cifar


def test_resnet18_cifar_has_the_reference_parameter_count():
    assert sum(p.numel() for p in resnet18().parameters()) == 11_173_962


def test_official_layout_loads_and_a_checksum_mismatch_is_recorded(tmp_path):
    folder = write_official_cifar(tmp_path, per_batch=6)
    with pytest.warns(UserWarning, match="md5 differs"):
        ds = data.load_cifar10(tmp_path, download=False)
    assert ds.checksum == "mismatch" and "data_batch_1" in ds.detail
    assert ds.train.images.shape == (30, 32, 32, 3) and ds.test.images.shape == (6, 32, 32, 3)
    # The official layout stores R, G and B planes one after the other for each image.
    with open(folder / "data_batch_1", "rb") as f:
        raw = pickle.load(f)
    first = raw["data"][0]
    assert np.array_equal(ds.train.images[0, :, :, 0].ravel(), first[:1024])
    assert np.array_equal(ds.train.images[0, :, :, 2].ravel(), first[2048:])
    assert ds.train.labels[:6].tolist() == raw["labels"]


def test_matching_checksums_are_reported_ok(tmp_path, monkeypatch):
    folder = write_official_cifar(tmp_path)
    monkeypatch.setattr(data, "OFFICIAL_MD5", {p.name: data._md5(p) for p in folder.iterdir()})
    assert data.load_cifar10(tmp_path, download=False).checksum == "ok"


def test_missing_and_offline_names_the_path_and_the_ways_out(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(data.DatasetUnavailable) as err:
        data.load_cifar10(tmp_path / "nowhere", download=True)
    text = str(err.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in text
    assert "name resolution" in text and "cifar10_from_jpeg.py" in text and "synthetic" in text


def test_synthetic_is_deterministic_and_learnable():
    a, b, c = data.synthetic(600, 200, seed=1), data.synthetic(600, 200, seed=1), data.synthetic(600, 200, seed=2)
    assert np.array_equal(a.train.images, b.train.images) and np.array_equal(a.train.labels, b.train.labels)
    assert not np.array_equal(a.train.images, c.train.images)
    assert a.train.images.shape == (600, 32, 32, 3) and a.train.images.dtype == np.uint8
    # Labels depend on the images: nearest class mean of the training split classifies the test split.
    x, y = a.train.images.reshape(600, -1).astype(np.float64), a.train.labels
    means = np.stack([x[y == k].mean(0) for k in range(10)])
    xt = a.test.images.reshape(200, -1).astype(np.float64)
    pred = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == a.test.labels).mean() > 0.9


def test_shards_split_a_global_batch_as_torch_chunk_does():
    for batch, world in [(128, 3), (80, 3), (128, 2), (7, 3), (3, 2)]:
        chunks = torch.arange(batch).chunk(world)
        for rank in range(world):
            expected = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(batch))[data.shard(batch, world, rank)] == expected


def test_ranks_together_see_exactly_the_global_batches():
    split = data.synthetic(50, 1, seed=0).train
    full = data.DeviceFeed(split, 16, seed=3, device=torch.device("cpu"))
    ranks = [data.DeviceFeed(split, 16, seed=3, device=torch.device("cpu"), world=3, rank=r) for r in range(3)]
    for whole, *parts in zip(full.epoch(1), *(f.epoch(1) for f in ranks)):
        assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])
        assert {p[2] for p in parts} == {whole[2]}
    assert [b[2] for b in full.epoch(0)] == [16, 16, 16, 2]   # the short last batch is kept


def _position_coded_split(n: int) -> data.Split:
    """Images whose pixels encode their column, so a crop's offset and flip can be read back."""
    col = np.tile(np.arange(32, dtype=np.uint8) * 4 + 100, (32, 1))
    img = np.stack([col, col, col], -1)
    return data.Split(np.repeat(img[None], n, 0), np.zeros(n, dtype=np.int64))


def _offsets_and_flips(x: torch.Tensor):
    """Recover the horizontal crop offset (0..8) and the flip from position-coded images."""
    std, mean = torch.tensor(data.STD).view(1, 3, 1, 1), torch.tensor(data.MEAN).view(1, 3, 1, 1)
    row = ((x * std + mean) * 255).round()[:, 0, 16, :]           # (B, 32) pixel values
    flips, offsets = [], []
    for r in row:
        real = r[r > 0]                             # the zero padding drops out
        flipped = bool(real[0] > real[-1])          # source columns run backwards
        r = r.flip(0) if flipped else r             # reversed, a flipped crop reads like a plain one
        first = int((r > 0).nonzero()[0])
        # Output column j shows padded column j + dx, i.e. source column j + dx - 4.
        offsets.append(int((r[first] - 100) / 4) - first + 4)
        flips.append(flipped)
    return torch.tensor(offsets), torch.tensor(flips)


def test_both_feeds_draw_crops_and_flips_from_the_same_distribution():
    split = _position_coded_split(1800)
    cpu = torch.device("cpu")
    gpu_x = torch.cat([b[0] for b in data.DeviceFeed(split, 600, 0, cpu).epoch(0)])
    torch_x = torch.cat([b[0] for b in data.TorchFeed(split, 600, 0, cpu, workers=0).epoch(0)])
    for x in (gpu_x, torch_x):
        dx, flip = _offsets_and_flips(x)
        assert dx.min() == 0 and dx.max() == 8
        counts = torch.bincount(dx, minlength=9).double() / len(dx)
        assert (counts - 1 / 9).abs().max() < 0.04          # uniform over the 9 offsets
        assert abs(flip.double().mean() - 0.5) < 0.05       # half the images are flipped
