"""The datasets a CIFAR-shaped run trains on: CIFAR-10 read from its official on-disk layout
(checked against the official md5 sums, downloaded where allowed, every failure naming the file
and the way out) or a seeded synthetic stand-in of the same shape.
"""
from __future__ import annotations

import hashlib
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpbench.run.torchvision_import import import_torchvision

CIFAR_FOLDER = "cifar-10-batches-py"
# md5 sums of the official release (the same ones torchvision checks).
OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]


class DatasetUnavailable(RuntimeError):
    """The dataset is neither on disk nor downloadable; the message says what to do. `folder` is
    the CIFAR-10 folder looked in, `missing` the files it lacks, `in_the_way` a file standing
    where a folder must be (None where there is none)."""

    def __init__(self, message: str, *, folder: Path | None = None, missing: list[str] | None = None,
                 in_the_way: Path | None = None):
        super().__init__(message)
        self.folder, self.missing, self.in_the_way = folder, list(missing or []), in_the_way


class DatasetDamaged(DatasetUnavailable):
    """A file of the dataset (`path`) is there but unreadable; the message names it and the way out."""

    def __init__(self, message: str, *, path: Path | None = None):
        super().__init__(message, folder=path.parent if path else None)
        self.path = path


# The first line of an error becomes a failed run's reason, so each message below says what
# happened, which file, and what to do, before its first line break.
REBUILD = "python -m dpbench.run.cifar_pack PACK.npz {root}"


def _ways_out(folder: Path) -> str:
    return (f"re-extract cifar-10-python.tar.gz into {folder.parent}, or rebuild the folder "
            f"from a CIFAR-10 JPEG pack with `{REBUILD.format(root=folder.parent)}`")


@dataclass
class Split:
    images: np.ndarray   # (N, 32, 32, 3) uint8, HWC; may be a view of channel-first memory
    labels: np.ndarray   # (N,) int64


@dataclass
class Dataset:
    name: str
    train: Split
    test: Split
    checksum: str        # ok | mismatch | n/a
    detail: str = ""

    def provenance(self) -> dict:
        return {"name": self.name, "checksum": self.checksum, "detail": self.detail,
                "train_size": len(self.train.labels), "test_size": len(self.test.labels)}


def load_dataset(cfg) -> Dataset:
    if cfg.dataset == "synthetic":
        return synthetic(cfg.synthetic_size, cfg.synthetic_test_size, cfg.seed)
    return load_cifar10(Path(cfg.data_root), download=cfg.download)


def synthetic(n_train: int, n_test: int, seed: int) -> Dataset:
    """CIFAR-shaped and learnable: each image is its class's fixed smooth pattern plus noise."""
    g = torch.Generator().manual_seed(seed)
    # Smooth class patterns: low-resolution noise upsampled, so convolutions can pick them up.
    coarse = torch.rand(10, 3, 4, 4, generator=g)
    patterns = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear",
                                               align_corners=False)

    def make(n: int) -> Split:
        labels = torch.randint(0, 10, (n,), generator=g)
        noise = torch.rand(n, 3, 32, 32, generator=g)
        imgs = (0.6 * patterns[labels] + 0.4 * noise).mul(255).round().clamp(0, 255)
        return Split(imgs.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy(),
                     labels.numpy().astype(np.int64))

    return Dataset("synthetic", make(n_train), make(n_test), "n/a", f"seed={seed}")


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_batch(path: Path) -> Split:
    """One official batch file; anything unreadable or misshapen names the file and the way out."""
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        if not isinstance(entry, dict):
            raise ValueError(f"holds a {type(entry).__name__}, not the official dict")
        if "data" not in entry or not ("labels" in entry or "fine_labels" in entry):
            raise ValueError(f"has no 'data' or 'labels' entry (keys: {sorted(map(str, entry))})")
        raw = np.asarray(entry["data"], dtype=np.uint8)
        labels = np.asarray(entry.get("labels", entry.get("fine_labels")), dtype=np.int64)
        if raw.size % 3072 or raw.size // 3072 != len(labels) or len(labels) == 0:
            raise ValueError(f"has {raw.size} pixel values for {len(labels)} labels "
                             f"(expected 3072 per image)")
        if labels.min() < 0 or labels.max() > 9:
            raise ValueError(f"has labels outside 0..9 ({labels.min()}..{labels.max()})")
    except Exception as exc:   # truncated, random bytes, another pickle: all end the same way
        cause = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise DatasetDamaged(f"CIFAR-10 file {path} is damaged ({cause}); "
                             f"{_ways_out(path.parent)}", path=path) from exc
    # A view: the gpu feed turns it back to channel-first, which is then a free reshape.
    return Split(raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels)


def missing_message(folder: Path, cause: str, missing: list[str] | None = None) -> str:
    where = (f"CIFAR-10 is not at {folder}" if not missing or not folder.is_dir()
             else f"CIFAR-10 at {folder} lacks {', '.join(missing)}")
    return (f"{where} and could not be downloaded ({cause}); {_ways_out(folder)}, "
            f"or set `dataset: synthetic` in the experiment's train options.\n"
            f"  The official layout is {folder}/data_batch_1..5 and test_batch, as extracted "
            f"from cifar-10-python.tar.gz.")


def not_a_folder_message(path: Path, folder: Path) -> str:
    """data_root, or the CIFAR-10 folder in it, is a file: nothing can be read or downloaded there."""
    return (f"{path} is a file, not a folder (CIFAR-10 is read from {folder}); move or remove "
            f"that file, then {_ways_out(folder)}, or set `dataset: synthetic` in the "
            f"experiment's train options.")


def load_cifar10(root: Path, download: bool = True) -> Dataset:
    folder = root / CIFAR_FOLDER
    files = TRAIN_FILES + ["test_batch"]
    for path in (root, folder):
        if path.exists() and not path.is_dir():
            raise DatasetUnavailable(not_a_folder_message(path, folder), folder=folder, in_the_way=path)
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        if not download:
            raise DatasetUnavailable(missing_message(folder, "download disabled", missing),
                                     folder=folder, missing=missing)
        _download(root, folder, missing)
    # Read before the checksum: a damaged file fails with its own name, not a mismatch warning.
    parts = [_read_batch(folder / f) for f in TRAIN_FILES]
    test = _read_batch(folder / "test_batch")
    bad = [f for f in files if _md5(folder / f) != OFFICIAL_MD5[f]]
    if bad:
        checksum = "mismatch"
        detail = (f"md5 differs from the official release for {', '.join(bad)}: "
                  f"not the official files (e.g. a JPEG-rebuilt copy); results may differ slightly")
        warnings.warn(f"CIFAR-10 at {folder}: {detail}", UserWarning, stacklevel=2)
    else:
        checksum, detail = "ok", "md5 matches the official release"
    # Joined channel-first (one copy of the pickles' memory order), seen as HWC.
    images = np.concatenate([p.images.transpose(0, 3, 1, 2) for p in parts]).transpose(0, 2, 3, 1)
    train = Split(images, np.concatenate([p.labels for p in parts]))
    return Dataset("cifar10", train, test, checksum, detail)


ARCHIVE = "cifar-10-python.tar.gz"


def _missing_folders(root: Path) -> list[Path]:
    """root and those of its parents that do not exist yet, deepest first."""
    out = []
    while not root.exists() and root != root.parent:
        out.append(root)
        root = root.parent
    return out


def _undo_download(created: list[Path]) -> None:
    """Remove the folders a failed download made (with the part of the archive it left in them):
    a failed run leaves the filesystem as it found it. A folder someone filled meanwhile stays."""
    for path in created:
        try:
            (path / ARCHIVE).unlink(missing_ok=True)
            path.rmdir()
        except OSError:
            return


def _download(root: Path, folder: Path, missing: list[str]) -> None:
    CIFAR10 = import_torchvision("torchvision.datasets").CIFAR10
    created = _missing_folders(root)
    try:
        CIFAR10(str(root), train=True, download=True)
    except Exception as exc:  # offline, DNS, proxy, partial file: all end the same way
        _undo_download(created)
        cause = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise DatasetUnavailable(missing_message(folder, cause, missing), folder=folder, missing=missing) from exc
    still = [f for f in missing if not (folder / f).is_file()]
    if still:
        raise DatasetUnavailable(missing_message(folder, "the download did not bring them", still),
                                 folder=folder, missing=still)
