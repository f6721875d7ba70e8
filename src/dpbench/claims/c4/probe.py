"""C4: the article's save/load recipe, and loads that round-trip the weights bit for bit."""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from dpbench.claims import CONFIRMED, NUANCE, REFUTED
from dpbench.claims.common import error_text, gpus_visible, needs, record
from dpbench.claims.records import Observation, ProbeRecord
from dpbench.claims.records import obs as observation
from dpbench.workloads.resnet import resnet18


def trained_like(seed: int = 0) -> nn.Module:
    """A model whose weights and BatchNorm buffers differ from any fresh one."""
    torch.manual_seed(seed)
    model = resnet18().train()
    with torch.no_grad():
        model(torch.randn(4, 3, 32, 32))  # moves running stats and num_batches_tracked
    return model


def identical(a: dict, b: dict) -> bool:
    """Same keys and every tensor equal bit for bit (compared on the CPU)."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def article_load(path: Path) -> dict:
    """net = nn.DataParallel(Resnet18()); net.load_state_dict(torch.load(path)), verbatim."""
    net = nn.DataParallel(resnet18())
    try:
        net.load_state_dict(torch.load(path))
    except RuntimeError as e:
        lines = str(e).splitlines()
        return {"error": error_text(e), "second_line": lines[1].strip()[:160] if len(lines) > 1 else ""}
    return {"result": "loads"}


def alternatives(saved: nn.Module, tmp: Path) -> dict[str, tuple[str, bool]]:
    """Each working way to load (id -> description, whether it reproduces `saved` exactly)."""
    ref = saved.state_dict()
    bare_path, wrapped_path = tmp / "bare.pt", tmp / "wrapped.pt"
    torch.save(saved.state_dict(), bare_path)                      # net.module.state_dict()
    torch.save(nn.DataParallel(saved).state_dict(), wrapped_path)  # the wrapper's, "module." keys

    def bare_first():
        m = resnet18()
        m.load_state_dict(torch.load(bare_path, map_location="cpu"))
        return nn.DataParallel(m).module

    def into_module():
        net = nn.DataParallel(resnet18())
        net.module.load_state_dict(torch.load(bare_path, map_location="cpu"))
        return net.module

    def consume_prefix():
        sd = torch.load(wrapped_path, map_location="cpu")
        consume_prefix_in_state_dict_if_present(sd, "module.")
        m = resnet18()
        m.load_state_dict(sd)
        return m

    def strip_by_hand():
        sd = torch.load(wrapped_path, map_location="cpu")
        m = resnet18()
        m.load_state_dict({k.removeprefix("module."): v for k, v in sd.items()})
        return m

    ways = {
        "c4.load.bare_then_wrap": ("load into the bare model, then wrap", bare_first),
        "c4.load.into_module": ("net.module.load_state_dict(...) on the wrapper", into_module),
        "c4.load.consume_prefix": ("wrapper's state_dict + consume_prefix_in_state_dict_if_present(sd, 'module.')",
                                   consume_prefix),
        "c4.load.strip_prefix": ("wrapper's state_dict, keys stripped of 'module.'", strip_by_hand),
    }
    return {oid: (what, identical(ref, way().state_dict())) for oid, (what, way) in ways.items()}


def map_location_cases(tmp: Path, src: str, targets: list[str]) -> list[Observation]:
    """A checkpoint saved on `src`, loaded with map_location=each target: device and exactness."""
    model = trained_like().to(src)
    path = tmp / "ckpt.pt"
    torch.save(model.state_dict(), path)
    out = []
    for target in [None] + targets:
        sd = torch.load(path, map_location=target)
        where = lambda d: (d or "none").replace(":", "")
        out.append(observation(f"c4.map_location.{where(src)}_to_{where(target)}",
                               f"saved on {src}, torch.load(map_location={target!r})",
                               device=str(next(iter(sd.values())).device),
                               round_trip_bit_exact=identical(model.state_dict(), sd)))
    return out


def run() -> ProbeRecord:
    n = gpus_visible()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        saved = trained_like()
        fresh = resnet18()
        torch.save(nn.DataParallel(saved).module.state_dict(), tmp / "article.pt")
        article = observation("c4.article_load",
                              "article's load: nn.DataParallel(Resnet18()).load_state_dict(torch.load(path))",
                              **article_load(tmp / "article.pt"))
        obs = [observation("c4.fresh_model_differs",
                           "a fresh model differs from the saved one (so round trips are not vacuous)",
                           result=not identical(saved.state_dict(), fresh.state_dict())), article]
        alts = alternatives(saved, tmp)
        obs += [observation(oid, what, round_trip_bit_exact=ok) for oid, (what, ok) in alts.items()]
        parts_not_run = []
        obs += map_location_cases(tmp, "cpu", ["cpu"])
        if n >= 2:
            obs += map_location_cases(tmp, "cuda:1", ["cpu", "cuda:0"])
        else:
            parts_not_run.append(f"checkpoint saved on cuda:1, loaded on cpu / cuda:0: {needs(2, n)}")

    article_fails = "error" in article.values
    all_exact = all(ok for _, ok in alts.values()) and all(o.get("round_trip_bit_exact", True) for o in obs)
    if article_fails and all_exact:
        verdict = NUANCE  # the save is right, the load as written raises
    elif article_fails:
        verdict = REFUTED
    else:
        verdict = CONFIRMED
    return record("C4", obs, verdict, parts_not_run=parts_not_run)
