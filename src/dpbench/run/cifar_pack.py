"""Rebuild CIFAR-10 in the official on-disk layout from a pack of its images as JPEG bytes.

    python -m dpbench.run.cifar_pack PACK.npz ROOT    ->  ROOT/cifar-10-batches-py/
                                                      data_batch_1..5, test_batch, batches.meta

For machines that can neither download the dataset nor receive the official archive. The pack
is an .npz (numpy, no pickled objects) of these arrays:

    jpeg_header          uint8 (H,)    the bytes every JPEG starts with (up to the end of its
                                       start-of-scan segment), stored once
    train_scans          uint8 (S,)    the rest of each training JPEG, one after another
    train_offsets        int64 (N+1,)  image i is jpeg_header + train_scans[offsets[i]:offsets[i+1]]
    train_labels         uint8 (N,)    0..9
    test_scans, test_offsets, test_labels   the same for the test split
    classes              str (10,)     the class names, in label order

The images are decoded (Pillow) to 32x32 RGB and written as the official pickles: a dict with
`data` (uint8, one row per image: the red, green and blue planes of 1024 bytes each), `labels`,
`batch_label` and `filenames`. JPEG is lossy, so pixels, and the files' md5 sums, differ from the
official release: dpbench loads such a copy with a warning and records `checksum: mismatch`.
"""
from __future__ import annotations

import argparse
import io
import pickle
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from dpbench.results import write_atomic

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
KEYS = ["jpeg_header", "classes"] + [f"{split}_{part}" for split in ("train", "test")
                                     for part in ("scans", "offsets", "labels")]
# The official training files are in no class order; a pack may be grouped by class, and cut
# in five as it stands every batch file would hold two classes. A fixed seed keeps rebuilds
# identical.
SHUFFLE_SEED = 0


class PackError(ValueError):
    """The pack is unusable; the message names the file and what is wrong with it."""


def load_pack(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise PackError(f"{path}: no such file") from None
    except Exception as exc:   # not a zip, truncated, pickled objects inside
        raise PackError(f"{path} is not a readable .npz pack ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    missing = [k for k in KEYS if k not in arrays]
    if missing:
        raise PackError(f"{path} lacks {', '.join(missing)} (a CIFAR-10 JPEG pack has "
                        f"{', '.join(KEYS)})")
    for split in ("train", "test"):
        offsets, labels = arrays[f"{split}_offsets"], arrays[f"{split}_labels"]
        size = len(arrays[f"{split}_scans"])
        if (len(offsets) != len(labels) + 1 or len(labels) == 0 or offsets[0] != 0
                or offsets[-1] != size or np.any(np.diff(offsets) <= 0)):
            raise PackError(f"{path}: {split}_offsets do not cut {split}_scans ({size} bytes) "
                            f"into {len(labels)} images")
        if labels.min() < 0 or labels.max() > 9:
            raise PackError(f"{path}: {split}_labels outside 0..9")
    return arrays


def decode(header: bytes, scans: np.ndarray, offsets: np.ndarray, split: str) -> np.ndarray:
    """(N, 32, 32, 3) uint8 RGB."""
    out = np.empty((len(offsets) - 1, 32, 32, 3), np.uint8)
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        try:
            with Image.open(io.BytesIO(header + scans[a:b].tobytes())) as im:
                pixels = np.asarray(im.convert("RGB"))
        except Exception as exc:
            raise PackError(f"{split} image {i} does not decode ({type(exc).__name__}: {exc})") from None
        if pixels.shape != (32, 32, 3):
            raise PackError(f"{split} image {i} is {pixels.shape[1]}x{pixels.shape[0]}, not 32x32")
        out[i] = pixels
    return out


def _write_pickle(path: Path, obj) -> None:
    # Whole or not at all (an interrupted rebuild must not leave a truncated batch file);
    # protocol 4 stores arrays compactly, and every Python 3 reads it.
    write_atomic(path, pickle.dumps(obj, protocol=4))


def _batch(name: str, images: np.ndarray, labels: np.ndarray, first: int) -> dict:
    return {"batch_label": name,
            "labels": labels.astype(np.int64).tolist(),
            "data": np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(labels), 3072)),
            "filenames": [f"{name}_{first + i}.png" for i in range(len(labels))]}


def rebuild(pack: Path, root: Path, log=print) -> Path:
    arrays = load_pack(pack)
    header = arrays["jpeg_header"].tobytes()
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SHUFFLE_SEED)
    for split, names in (("train", TRAIN_FILES), ("test", ["test_batch"])):
        images = decode(header, arrays[f"{split}_scans"], arrays[f"{split}_offsets"], split)
        labels = arrays[f"{split}_labels"]
        order = rng.permutation(len(labels))
        images, labels = images[order], labels[order]
        first = 0
        for name, part in zip(names, np.array_split(np.arange(len(labels)), len(names))):
            _write_pickle(folder / name, _batch(name, images[part], labels[part], first))
            first += len(part)
        log(f"{split}: {len(labels)} images -> {', '.join(names)}")
    _write_pickle(folder / "batches.meta",
                  {"label_names": [str(c) for c in arrays["classes"]],
                   "num_cases_per_batch": -(-len(arrays["train_labels"]) // len(TRAIN_FILES)),
                   "num_vis": 3072})
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dpbench.run.cifar_pack",
        description="Rebuild ROOT/cifar-10-batches-py (the official layout) from a CIFAR-10 JPEG pack.")
    p.add_argument("pack", type=Path, help="the .npz pack of JPEG bytes")
    p.add_argument("root", type=Path, help="where cifar-10-batches-py goes (dpbench's data_root: data)")
    args = p.parse_args(argv)
    try:
        folder = rebuild(args.pack, args.root)
    except PackError as exc:
        print(f"dpbench.run.cifar_pack: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {folder} (JPEG pixels: its md5 sums differ from the official release, "
          f"and runs record checksum: mismatch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
