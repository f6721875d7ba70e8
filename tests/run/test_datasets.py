"""dpbench.run.datasets: CIFAR-10's official layout, its checksums, a missing, damaged or
undownloadable copy, and the synthetic stand-in."""
import pickle
import re
import urllib.error

import numpy as np
import pytest
from conftest import write_official_cifar

from dpbench.run import datasets


def test_official_layout_loads_and_a_checksum_mismatch_is_recorded(tmp_path):
    folder = write_official_cifar(tmp_path, per_batch=6)
    with pytest.warns(UserWarning, match=re.escape(str(folder))):
        ds = datasets.load_cifar10(tmp_path, download=False)
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
    monkeypatch.setattr(datasets, "OFFICIAL_MD5", {p.name: datasets._md5(p) for p in folder.iterdir()})
    assert datasets.load_cifar10(tmp_path, download=False).checksum == "ok"


# what an offline machine's download raises: its cause reaches the message's first line
OFFLINE = "[Errno -3] Temporary failure in name resolution"


def test_missing_and_offline_names_the_path_and_the_ways_out(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError(OFFLINE)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(datasets.DatasetUnavailable) as err:
        datasets.load_cifar10(tmp_path / "nowhere", download=True)
    folder = tmp_path / "nowhere" / datasets.CIFAR_FOLDER
    assert err.value.folder == folder and err.value.missing == datasets.TRAIN_FILES + ["test_batch"]
    text = str(err.value)
    first = text.splitlines()[0]   # a failed run's reason is the first line
    assert str(folder) in first and OFFLINE in first and "synthetic" in first
    assert datasets.REBUILD.format(root=folder.parent) in first
    assert "shared/" not in text


def test_synthetic_is_deterministic_and_learnable():
    a, b, c = datasets.synthetic(600, 200, seed=1), datasets.synthetic(600, 200, seed=1), datasets.synthetic(600, 200, seed=2)
    assert np.array_equal(a.train.images, b.train.images) and np.array_equal(a.train.labels, b.train.labels)
    assert not np.array_equal(a.train.images, c.train.images)
    assert a.train.images.shape == (600, 32, 32, 3) and a.train.images.dtype == np.uint8
    # Labels depend on the images: nearest class mean of the training split classifies the test split.
    x, y = a.train.images.reshape(600, -1).astype(np.float64), a.train.labels
    means = np.stack([x[y == k].mean(0) for k in range(10)])
    xt = a.test.images.reshape(200, -1).astype(np.float64)
    pred = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == a.test.labels).mean() > 0.9


# -- damaged and incomplete copies ----------------------------------------------------------

def _damage(path, how):
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not_a_batch":
        path.write_bytes(pickle.dumps(["a", "list"]))
    elif how == "short_data":
        with open(path, "rb") as f:
            entry = pickle.load(f)
        entry["data"] = entry["data"][:, :1000]
        path.write_bytes(pickle.dumps(entry))


@pytest.mark.parametrize("name", ["data_batch_1", "test_batch"])
@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "not_a_batch", "short_data"])
def test_a_damaged_file_is_named_with_the_way_out(tmp_path, name, how):
    folder = write_official_cifar(tmp_path)
    _damage(folder / name, how)
    with pytest.raises(datasets.DatasetDamaged) as err:
        datasets.load_cifar10(tmp_path, download=False)
    assert err.value.path == folder / name and err.value.folder == folder
    first = str(err.value).splitlines()[0]
    assert str(folder / name) in first and datasets.ARCHIVE in first
    assert datasets.REBUILD.format(root=tmp_path) in first


def test_a_missing_file_is_named_not_the_folder(tmp_path):
    folder = write_official_cifar(tmp_path)
    (folder / "test_batch").unlink()
    with pytest.raises(datasets.DatasetUnavailable) as err:
        datasets.load_cifar10(tmp_path, download=False)
    assert err.value.folder == folder and err.value.missing == ["test_batch"]
    first = str(err.value).splitlines()[0]
    assert "test_batch" in first and not any(name in first for name in datasets.TRAIN_FILES)
    assert datasets.REBUILD.format(root=tmp_path) in first
