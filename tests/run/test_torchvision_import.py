"""dpbench.run.torchvision_import: a torchvision built for another torch, in one line."""
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
    text = str(err.value)
    assert "\n" not in text
    from importlib import metadata
    assert f"torchvision {metadata.version('torchvision')}" in text and f"torch {torch.__version__}" in text
    assert "torchvision::nms" in text and "pip install" in text
    # Other RuntimeErrors are not dressed up as a mismatch.
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        torchvision_import.import_torchvision()


@pytest.mark.parametrize("torch_version, expected", [
    ("2.13.0+cpu", "0.28.0"), ("2.14.1+cu130", "0.29.1"), ("2.4.1", "0.19.1"), ("3.0.0", None)])
def test_the_matching_torchvision_of_a_torch(torch_version, expected):
    assert torchvision_import._matching_torchvision(torch_version) == expected
