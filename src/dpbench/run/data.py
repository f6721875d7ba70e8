"""The feeds: each step's part of a global batch for this rank, in the same sequence of global
batches for every variant.

The order of an epoch is a seeded permutation, and a DDP rank takes its shard of each global
batch exactly as DataParallel's scatter would (`torch.chunk`). The `gpu` feed also draws each
sample's crop and flip from the seed, so its augmentations are identical across variants and GPU
counts; the `torch` feed uses torchvision's transforms in DataLoader workers, as the
kuangliu/pytorch-cifar recipe does: its draws are seeded too, but depend on the workers and on how
a batch is sharded, so they differ between GPU counts (same distribution, different draws). A
workload other than CIFAR's draws its global batches from its own batch maker (WorkloadFeed),
sharded the same way. The datasets themselves are dpbench.run.datasets'.
"""
from __future__ import annotations

from typing import Iterator

import torch

from dpbench.run.datasets import Split
from dpbench.run.torchvision_import import import_torchvision
from dpbench.workloads.calls import batch_size, map_tensors, nbytes

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4


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
        from PIL import Image   # Pillow comes with torchvision, which only this feed needs (import_torchvision)
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
