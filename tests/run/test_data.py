"""dpbench.run.data: the feeds' batch order, sharding and augmentation."""
import numpy as np
import torch

from dpbench.run import data
from dpbench.run.datasets import Split, synthetic
from dpbench.workloads.resnet import resnet18


def test_resnet18_cifar_has_the_reference_parameter_count():
    assert sum(p.numel() for p in resnet18().parameters()) == 11_173_962


def test_shards_split_a_global_batch_as_torch_chunk_does():
    for batch, world in [(128, 3), (80, 3), (128, 2), (7, 3), (3, 2)]:
        chunks = torch.arange(batch).chunk(world)
        for rank in range(world):
            expected = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(batch))[data.shard(batch, world, rank)] == expected


def test_ranks_together_see_exactly_the_global_batches():
    split = synthetic(50, 1, seed=0).train
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
    split = synthetic(40, 1, seed=0).train
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

def _position_coded_split(n: int) -> Split:
    """Images whose pixels encode their column, so a crop's offset and flip can be read back."""
    col = np.tile(np.arange(32, dtype=np.uint8) * 4 + 100, (32, 1))
    img = np.stack([col, col, col], -1)
    return Split(np.repeat(img[None], n, 0), np.zeros(n, dtype=np.int64))


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
