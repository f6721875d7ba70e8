"""CIFAR-10 (official on-disk layout) and synthetic data, and the two feeds.

Every variant sees the same sequence of global batches: the order of an epoch is a seeded
permutation, and a DDP rank takes its shard of each global batch exactly as DataParallel's
scatter would (`torch.chunk`). The `gpu` feed also draws each sample's crop and flip from the
seed, so its augmentations are identical across variants and GPU counts; the `torch` feed uses
torchvision's transforms in DataLoader workers, as the kuangliu/pytorch-cifar recipe does: its
draws are seeded too, but depend on the workers and on how a batch is sharded, so they differ
between GPU counts (same distribution, different draws). A workload other than CIFAR's draws its
global batches from its own batch maker (WorkloadFeed), sharded the same way. Both feeds live here,
over 450 lines, because they must shard a global batch identically: one module keeps them in step.
"""
from __future__ import annotations

import hashlib
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from dpbench.workloads.calls import batch_size, map_tensors, nbytes

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4
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
    """The dataset is neither on disk nor downloadable; the message says what to do."""


class DatasetDamaged(DatasetUnavailable):
    """A file of the dataset is there but unreadable; the message names it and the way out."""


class TorchvisionMismatch(RuntimeError):
    """torchvision was built for another torch than the one installed."""


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


# -- sources --------------------------------------------------------------------------------

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
                             f"{_ways_out(path.parent)}") from exc
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
            raise DatasetUnavailable(not_a_folder_message(path, folder))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        if not download:
            raise DatasetUnavailable(missing_message(folder, "download disabled", missing))
        _download(root, folder, missing)
    # Read before the checksum: a damaged file fails with its own name, not a mismatch warning.
    parts = [_read_batch(folder / f) for f in TRAIN_FILES]
    test = _read_batch(folder / "test_batch")
    bad = [f for f in files if _md5(folder / f) != OFFICIAL_MD5[f]]
    if bad:
        checksum = "mismatch"
        detail = (f"md5 differs from the official release for {', '.join(bad)}: "
                  f"not the official files (e.g. a JPEG-rebuilt copy); results may differ slightly")
        import warnings
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
        raise DatasetUnavailable(missing_message(folder, cause, missing)) from exc
    still = [f for f in missing if not (folder / f).is_file()]
    if still:
        raise DatasetUnavailable(missing_message(folder, "the download did not bring them", still))


def import_torchvision(module: str = "torchvision"):
    """Import a torchvision module; a build for another torch fails with one clear line.

    A torchvision wheel works only with the torch it was built against (same release and
    same build: CPU or CUDA). Otherwise its C++ operators do not register and the import
    fails deep inside with "operator torchvision::nms does not exist".
    """
    import importlib
    try:
        return importlib.import_module(module)
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        raise TorchvisionMismatch(mismatch_message(str(exc))) from exc


def mismatch_message(cause: str) -> str:
    tv, wants = _torchvision_build()
    built = f" (it asks for {wants})" if wants else ""
    pair = _matching_torchvision(torch.__version__)
    fix = (f"pip install --force-reinstall torch=={torch.__version__.split('+')[0]} "
           f"torchvision=={pair}" if pair else "pip install torchvision of the same release")
    first = cause.strip().splitlines()[0] if cause.strip() else "its operators are missing"
    return (f"torchvision {tv} does not match torch {torch.__version__}{built}: {first}; "
            f"install the matching pair from the same index, e.g. `{fix}` "
            f"(from the index torch came from; for CPU builds "
            f"--index-url https://download.pytorch.org/whl/cpu)")


def _torchvision_build() -> tuple[str, str]:
    """torchvision's full version (with its +cpu/+cuXXX build) and the torch it asks for,
    read without importing it (the import is what fails)."""
    import importlib.util
    from importlib import metadata
    try:
        version, wants = metadata.version("torchvision"), ""
        for req in metadata.requires("torchvision") or []:
            name, _, rest = req.partition(" ")
            if re.split(r"[;(<>=!~\[]", name, maxsplit=1)[0] == "torch":
                wants = "torch" + re.sub(r"[\s()]", "", (name[5:] + rest).split(";")[0])
    except metadata.PackageNotFoundError:
        return "?", ""
    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (Path(folder) / "version.py").read_text())
        except OSError:
            continue
        if m:
            version = m.group(1)
    return version, wants


def _matching_torchvision(torch_version: str) -> str | None:
    """torchvision 0.(minor+15).patch pairs with torch 2.minor.patch (since torch 2.0)."""
    try:
        major, minor, patch = (int(v) for v in torch_version.split("+")[0].split(".")[:3])
    except ValueError:
        return None
    return f"0.{minor + 15}.{patch}" if major == 2 else None


# -- batch order and sharding ---------------------------------------------------------------

def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=g)


def epoch_augment(n: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-position crop offsets (0..2*PAD) and flips, drawn from the seed, for the gpu feed."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch + 7_919)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=g)
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=g)
    flip = torch.randint(0, 2, (n,), generator=g).bool()
    return dx, dy, flip


def global_batches(n: int, batch: int) -> list[slice]:
    """Positions of each global batch in an epoch's order; the last may be short (not dropped)."""
    return [slice(i, min(i + batch, n)) for i in range(0, n, batch)]


def shard(batch_size: int, world: int, rank: int) -> slice:
    """This rank's part of a global batch, split as torch.chunk splits it for DataParallel."""
    size = -(-batch_size // world)
    start = min(rank * size, batch_size)
    return slice(start, min(start + size, batch_size))


def steps_per_epoch(n: int, batch: int) -> int:
    return len(global_batches(n, batch))


# -- feeds ----------------------------------------------------------------------------------

class DeviceFeed:
    """The whole split resident on the device; crop+flip+normalise as a few tensor ops."""

    def __init__(self, split: Split, batch: int, seed: int, device: torch.device,
                 world: int = 1, rank: int = 0, augment: bool = True):
        imgs = torch.from_numpy(split.images).permute(0, 3, 1, 2).contiguous()
        if augment:
            imgs = torch.nn.functional.pad(imgs, (PAD, PAD, PAD, PAD))
        self.images = imgs.to(device)
        self.labels = torch.from_numpy(split.labels).to(device)
        self.resident_bytes = self.images.nbytes + self.labels.nbytes
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
        self.n, self.batch, self.seed = len(split.labels), batch, seed
        self.world, self.rank, self.augment, self.device = world, rank, augment, device
        self.arange = torch.arange(32, device=device)

    def __len__(self) -> int:
        return steps_per_epoch(self.n, self.batch)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
        """(this rank's images, labels, size of the global batch) for every step.

        The epoch's order and augmentation are drawn and copied to the device here, when the
        call returns, not at the first step: the copies from pageable host memory block the
        host, and would otherwise fall into the first (timed) step of every later epoch."""
        dx = dy = flip = None
        if self.augment:
            order = epoch_order(self.n, self.seed, epoch)
            dx, dy, flip = (t.to(self.device) for t in epoch_augment(self.n, self.seed, epoch))
        else:
            order = torch.arange(self.n)
        return self._batches(order.to(self.device), dx, dy, flip)

    def _batches(self, order, dx, dy, flip):
        """The epoch's steps, over what epoch() prepared."""
        for pos in global_batches(self.n, self.batch):
            part = shard(pos.stop - pos.start, self.world, self.rank)
            sl = slice(pos.start + part.start, pos.start + part.stop)
            idx = order[sl]
            x = self._crop_flip(idx, dx[sl], dy[sl], flip[sl]) if self.augment else self.images[idx]
            yield (x.float() - self.mean) / self.std, self.labels[idx], pos.stop - pos.start

    def _crop_flip(self, idx, dx, dy, flip):
        rows = (dy[:, None] + self.arange)[:, None, :, None]                 # (B,1,32,1)
        cols = torch.where(flip[:, None], dx[:, None] + 31 - self.arange, dx[:, None] + self.arange)
        b = torch.arange(len(idx), device=self.device)[:, None, None, None]
        c = torch.arange(3, device=self.device)[None, :, None, None]
        return self.images[idx][b, c, rows, cols[:, None, None, :]]


class _ArrayDataset(torch.utils.data.Dataset):
    def __init__(self, split: Split, transform):
        self.split, self.transform = split, transform

    def __len__(self):
        return len(self.split.labels)

    def __getitem__(self, i):
        from PIL import Image
        return self.transform(Image.fromarray(self.split.images[i])), int(self.split.labels[i])


class _ShardedBatches(torch.utils.data.Sampler):
    """Yields this rank's indices of each global batch, in the seeded epoch order."""

    def __init__(self, n, batch, seed, world, rank, shuffle):
        self.n, self.batch, self.seed, self.world, self.rank, self.shuffle = n, batch, seed, world, rank, shuffle
        self.epoch = 0

    def __len__(self):
        return steps_per_epoch(self.n, self.batch)

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch) if self.shuffle else torch.arange(self.n)
        for pos in global_batches(self.n, self.batch):
            part = shard(pos.stop - pos.start, self.world, self.rank)
            yield order[pos.start + part.start:pos.start + part.stop].tolist()


class TorchFeed:
    """torchvision transforms and a DataLoader with workers: the kuangliu/pytorch-cifar way."""

    def __init__(self, split: Split, batch: int, seed: int, device: torch.device,
                 world: int = 1, rank: int = 0, augment: bool = True, workers: int = 2):
        T = import_torchvision("torchvision.transforms")
        steps = [T.RandomCrop(32, padding=PAD), T.RandomHorizontalFlip()] if augment else []
        transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])
        self.sampler = _ShardedBatches(len(split.labels), batch, seed, world, rank, shuffle=augment)
        self.device = device
        self.resident_bytes = 0   # the data stays on the host
        self.loader = torch.utils.data.DataLoader(
            _ArrayDataset(split, transform), batch_sampler=self.sampler, num_workers=workers,
            pin_memory=device.type == "cuda", persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
        """The loader's iterator is made here (its workers start and begin prefetching), not at
        the first step, so that the first step of a later epoch times the step alone."""
        self.sampler.epoch = epoch
        sizes = [p.stop - p.start for p in global_batches(self.sampler.n, self.sampler.batch)]
        return self._batches(iter(self.loader), sizes)

    def _batches(self, loader, sizes):
        """The epoch's steps, from the loader iterator epoch() started."""
        for (x, y), n_global in zip(loader, sizes):
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True), n_global


class FixedBatchFeed(DeviceFeed):
    """The first global batch of epoch 0, already on the device, served every step: the loop's
    compute-only ceiling, against which the real feeds are measured."""

    def epoch(self, epoch: int):
        if not hasattr(self, "_batch"):
            self._batch = next(super().epoch(0))
        return iter([self._batch] * len(self))


class WorkloadFeed:
    """A workload's synthetic batches (WorkloadSpec.batch): global step i's batch drawn whole by a
    generator seeded by (seed, i), then split as every feed splits a global batch (`shard`), so
    single, dp* and ddp on any number of ranks see the same global batches. Inputs may be a
    tensor or a tuple or dict of tensors (workloads.calls): each is sliced alike, and the global
    batch's size is the first tensor's. An epoch is `samples` samples in global batches (the last
    may be short); its batches are drawn and copied to the device when epoch() is called, before
    its step clock starts, and no more of them than the run's `total` steps take. fixed=True:
    global step 0's batch every step, the same device tensors (one batch resident, as a bare loop
    holds it)."""

    def __init__(self, make_batch, samples: int, batch: int, seed: int, device: torch.device,
                 world: int = 1, rank: int = 0, total: int | None = None, fixed: bool = False):
        self.make_batch, self.samples, self.batch, self.seed = make_batch, samples, batch, seed
        self.device, self.world, self.rank, self.fixed = device, world, rank, fixed
        self.total = total
        self.resident_bytes = 0

    def __len__(self) -> int:
        return steps_per_epoch(self.samples, self.batch)

    def global_batch(self, step: int, n: int):
        """Global step `step`'s batch of n samples, on the CPU, whole."""
        return self.make_batch(torch.Generator().manual_seed(self.seed * 1_000_003 + step), n)

    def _part(self, step: int, n: int):
        """This rank's part of global step `step`'s batch, on the device, and the global size."""
        x, y = self.global_batch(step, n)
        n_global = batch_size(x)
        part = shard(n_global, self.world, self.rank)
        return map_tensors(x, lambda t: t[part].to(self.device)), y[part].to(self.device), n_global

    def epoch(self, epoch: int) -> Iterator[tuple]:
        first = epoch * len(self)
        out = []
        if self.fixed:
            steps = len(self) if self.total is None else max(0, min(len(self), self.total - first))
            if not hasattr(self, "_fixed"):
                self._fixed = self._part(0, self.batch)
            out = [self._fixed] * steps
            self.resident_bytes = max(self.resident_bytes, nbytes(self._fixed[0]) + self._fixed[1].nbytes)
            return iter(out)
        for i, pos in enumerate(global_batches(self.samples, self.batch)):
            step = first + i
            if self.total is not None and step >= self.total:
                break
            out.append(self._part(step, pos.stop - pos.start))
        self.resident_bytes = max(self.resident_bytes, sum(nbytes(x) + y.nbytes for x, y, _ in out))
        return iter(out)


def make_feed(kind: str, split: Split, batch: int, seed: int, device: torch.device,
              world: int = 1, rank: int = 0, augment: bool = True, workers: int = 2):
    if kind == "gpu":
        return DeviceFeed(split, batch, seed, device, world, rank, augment)
    if kind == "fixed":
        return FixedBatchFeed(split, batch, seed, device, world, rank, augment)
    return TorchFeed(split, batch, seed, device, world, rank, augment, workers)
