"""dpbench.run.torchvision_import: a torchvision built for another torch, in one line."""
from importlib import metadata

import pytest
import torch

from dpbench.run import data, datasets, torchvision_import


def test_a_torchvision_built_for_another_torch_gives_one_clear_line(monkeypatch):
    import importlib

    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(torchvision_import.TorchvisionMismatch) as err:
        data.TorchFeed(datasets.synthetic(8, 1, 0).train, 4, 0, torch.device("cpu"), workers=0)
    mismatch = err.value
    # the release as installed; the version read from the package may add its build (+cpu, +cu130)
    assert mismatch.torchvision.startswith(metadata.version("torchvision")) and mismatch.torch == torch.__version__
    assert mismatch.pair == torchvision_import._matching_torchvision(torch.__version__)
    text = str(mismatch)
    assert "\n" not in text and "torchvision::nms" in text   # the cause, on one line
    assert mismatch.torchvision in text and mismatch.torch in text and f"torchvision=={mismatch.pair}" in text
    # Other RuntimeErrors are not dressed up as a mismatch.
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        torchvision_import.import_torchvision()


@pytest.mark.parametrize("torch_version, expected", [
    ("2.13.0+cpu", "0.28.0"), ("2.14.1+cu130", "0.29.1"), ("2.4.1", "0.19.1"), ("3.0.0", None)])
def test_the_matching_torchvision_of_a_torch(torch_version, expected):
    assert torchvision_import._matching_torchvision(torch_version) == expected
