import io
import pickle
import urllib.error

import numpy as np
import pytest
import torch
from conftest import write_official_cifar

from dpbench.run import data
from dpbench.workloads.resnet import resnet18


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
    first = text.splitlines()[0]   # a failed run's reason is the first line
    assert "name resolution" in first and "python -m dpbench.run.cifar_pack" in first and "synthetic" in first
    assert "shared/" not in text


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



def test_an_epoch_is_prepared_when_it_is_asked_for_not_at_its_first_step(monkeypatch):
    """The order, the crops and their copies to the device happen in epoch() itself: the
    engine asks for the epoch before its step clock starts, so they never fall into a step."""
    drawn = []
    real_order = data.epoch_order
    monkeypatch.setattr(data, "epoch_order", lambda *a: drawn.append(a) or real_order(*a))
    split = data.synthetic(40, 1, seed=0).train
    cpu = torch.device("cpu")
    for feed in (data.DeviceFeed(split, 16, seed=3, device=cpu), data.FixedBatchFeed(split, 16, seed=3, device=cpu)):
        drawn.clear()
        batches = feed.epoch(1)
        assert drawn, f"{type(feed).__name__}: nothing was drawn before the first step"
        assert len(list(batches)) == len(feed)

    loader_feed = data.TorchFeed(split, 16, seed=3, device=cpu, augment=False, workers=0)
    started = []
    loader = loader_feed.loader
    monkeypatch.setattr(loader_feed, "loader", type("L", (), {"__iter__": lambda self: started.append(1) or iter(loader)})())
    batches = loader_feed.epoch(0)
    assert started, "the loader's iterator (its workers) must start in epoch(), not at the first step"
    assert [b[2] for b in batches] == [16, 16, 8]

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
    with pytest.raises(data.DatasetDamaged) as err:
        data.load_cifar10(tmp_path, download=False)
    first = str(err.value).splitlines()[0]
    assert str(folder / name) in first
    assert "re-extract cifar-10-python.tar.gz" in first
    assert f"python -m dpbench.run.cifar_pack PACK.npz {tmp_path}" in first


def test_a_missing_file_is_named_not_the_folder(tmp_path):
    folder = write_official_cifar(tmp_path)
    (folder / "test_batch").unlink()
    with pytest.raises(data.DatasetUnavailable) as err:
        data.load_cifar10(tmp_path, download=False)
    first = str(err.value).splitlines()[0]
    assert f"CIFAR-10 at {folder} lacks test_batch" in first and "is not at" not in first
    assert "dpbench.run.cifar_pack" in first


# -- torch and torchvision ------------------------------------------------------------------

def test_a_torchvision_built_for_another_torch_gives_one_clear_line(monkeypatch):
    import importlib

    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(data.TorchvisionMismatch) as err:
        data.TorchFeed(data.synthetic(8, 1, 0).train, 4, 0, torch.device("cpu"), workers=0)
    text = str(err.value)
    assert "\n" not in text
    from importlib import metadata
    assert f"torchvision {metadata.version('torchvision')}" in text and f"torch {torch.__version__}" in text
    assert "torchvision::nms" in text and "pip install" in text
    # Other RuntimeErrors are not dressed up as a mismatch.
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        data.import_torchvision()


@pytest.mark.parametrize("torch_version, expected", [
    ("2.13.0+cpu", "0.28.0"), ("2.14.1+cu130", "0.29.1"), ("2.4.1", "0.19.1"), ("3.0.0", None)])
def test_the_matching_torchvision_of_a_torch(torch_version, expected):
    assert data._matching_torchvision(torch_version) == expected


# -- the JPEG pack converter ----------------------------------------------------------------

def make_pack(path, per_split=(30, 10), seed=0):
    """A small CIFAR-10 JPEG pack (the format dpbench.run.cifar_pack reads) and its source images."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    arrays, images = {"classes": np.array([f"class{k}" for k in range(10)])}, {}
    header = None
    for split, n in zip(("train", "test"), per_split):
        # Smooth images survive JPEG nearly unchanged, so the round trip can be checked.
        coarse = rng.integers(0, 256, (n, 4, 4, 3)).astype(np.uint8)
        imgs = np.stack([np.asarray(Image.fromarray(c).resize((32, 32), Image.BILINEAR)) for c in coarse])
        scans, offsets = [], [0]
        for img in imgs:
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=95)
            jpeg = buf.getvalue()
            sos = jpeg.index(b"\xff\xda")
            end = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")
            assert header in (None, jpeg[:end])
            header = jpeg[:end]
            scans.append(jpeg[end:])
            offsets.append(offsets[-1] + len(jpeg) - end)
        labels = np.arange(n) % 10          # grouped by class, as a pack may be
        labels.sort()
        arrays[f"{split}_scans"] = np.frombuffer(b"".join(scans), np.uint8)
        arrays[f"{split}_offsets"] = np.array(offsets, np.int64)
        arrays[f"{split}_labels"] = labels.astype(np.uint8)
        images[split] = imgs
    arrays["jpeg_header"] = np.frombuffer(header, np.uint8)
    np.savez(path, **arrays)
    return images, arrays


def test_the_pack_converter_rebuilds_the_official_layout(tmp_path, capsys):
    from dpbench.run import cifar_pack
    images, arrays = make_pack(tmp_path / "pack.npz")
    assert cifar_pack.main([str(tmp_path / "pack.npz"), str(tmp_path / "data")]) == 0
    folder = tmp_path / "data" / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted(data.TRAIN_FILES + ["test_batch", "batches.meta"])
    with pytest.warns(UserWarning, match="md5 differs"):
        ds = data.load_cifar10(tmp_path / "data", download=False)
    assert ds.checksum == "mismatch"
    assert ds.train.images.shape == (30, 32, 32, 3) and ds.test.images.shape == (10, 32, 32, 3)
    with open(folder / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    assert raw["data"].dtype == np.uint8 and raw["data"].shape == (6, 3072) and len(raw["labels"]) == 6
    with open(folder / "batches.meta", "rb") as f:
        assert pickle.load(f)["label_names"][:2] == ["class0", "class1"]
    # Every source image comes back (shuffled, JPEG-close) with its own label.
    for split in ("train", "test"):
        got = getattr(ds, split)
        src = images[split].reshape(len(images[split]), -1).astype(float)
        dist = np.abs(got.images.reshape(len(got.labels), -1)[:, None, :] - src[None]).mean(-1)
        match = dist.argmin(1)
        assert sorted(match.tolist()) == list(range(len(src)))
        assert dist.min(1).max() < 4
        assert np.array_equal(got.labels, arrays[f"{split}_labels"][match])
    assert len(set(ds.train.labels[:6].tolist())) > 2     # not grouped by class any more
    # A rebuild is identical: the shuffle is seeded.
    before = (folder / "data_batch_3").read_bytes()
    assert cifar_pack.main([str(tmp_path / "pack.npz"), str(tmp_path / "data")]) == 0
    assert (folder / "data_batch_3").read_bytes() == before


@pytest.mark.parametrize("damage, expected", [
    ("missing", "no such file"),
    ("garbage", "not a readable .npz pack"),
    ("no_header", "lacks jpeg_header"),
    ("bad_offsets", "train_offsets do not cut"),
])
def test_a_bad_pack_exits_2_with_one_line(tmp_path, capsys, damage, expected):
    from dpbench.run import cifar_pack
    pack = tmp_path / "pack.npz"
    _, arrays = make_pack(pack, per_split=(10, 10))
    if damage == "missing":
        pack.unlink()
    elif damage == "garbage":
        pack.write_bytes(b"not a zip at all")
    elif damage == "no_header":
        np.savez(pack, **{k: v for k, v in arrays.items() if k != "jpeg_header"})
    elif damage == "bad_offsets":
        np.savez(pack, **dict(arrays, train_offsets=arrays["train_offsets"][:-1]))
    assert cifar_pack.main([str(pack), str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and str(pack) in err
