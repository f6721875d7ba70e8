"""dpbench.run.cifar_pack: a CIFAR-10 JPEG pack rebuilt into the official layout."""
import io
import pickle
import re

import numpy as np
import pytest

from dpbench.run import cifar_pack, datasets


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
    images, arrays = make_pack(tmp_path / "pack.npz")
    assert cifar_pack.main([str(tmp_path / "pack.npz"), str(tmp_path / "data")]) == 0
    folder = tmp_path / "data" / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted(datasets.TRAIN_FILES + ["test_batch", "batches.meta"])
    with pytest.warns(UserWarning, match=re.escape(str(folder))):
        ds = datasets.load_cifar10(tmp_path / "data", download=False)
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
