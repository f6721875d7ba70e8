"""The spawn helper every multi-rank test goes through: a rank that dies by a signal (in C++)
gets the spawn once more, with its Python stack in a warning; a Python error or a second death
does not."""
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from sharded_ranks import on_ranks


def _rank_1_dies(rank: int, world: int, store: str, marks: str, times: int) -> None:
    """Rank 1 aborts (SIGABRT, as gloo's std::terminate does) on its first `times` spawns."""
    spawns = Path(marks) / f"rank{rank}"
    spawns.mkdir(exist_ok=True)
    (spawns / str(len(list(spawns.iterdir())))).touch()
    if rank == 1 and len(list(spawns.iterdir())) <= times:
        os.abort()


def _rank_1_raises(rank: int, world: int, store: str, marks: str) -> None:
    (Path(marks) / f"rank{rank}-{len(list(Path(marks).iterdir()))}").touch()
    if rank == 1:
        raise ValueError("a Python error in a rank")


@pytest.mark.slow   # five spawns: ~20 s on 2 cores
def test_a_rank_aborting_once_respawns_all_ranks_with_its_stack_in_a_warning(tmp_path):
    store = tmp_path / "store"
    store.write_text("left by the dead spawn")
    with pytest.warns(UserWarning, match=r"(?s)rank 1 died by SIGABRT.*_rank_1_dies"):
        on_ranks(_rank_1_dies, 2, (2, str(store), str(tmp_path), 1))
    assert len(list((tmp_path / "rank1").iterdir())) == 2   # spawned again (rank 0 may die before its mark)
    assert not store.exists()   # removed before the second spawn, so its ranks meet afresh


@pytest.mark.slow
def test_a_second_death_or_a_python_error_fails(tmp_path):
    with pytest.warns(UserWarning), pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        on_ranks(_rank_1_dies, 2, (2, str(tmp_path / "store"), str(tmp_path), 2))
    assert len(list((tmp_path / "rank1").iterdir())) == 2   # two spawns, not a third
    marks = tmp_path / "python-error"
    marks.mkdir()
    with pytest.raises(mp.ProcessRaisedException, match="a Python error in a rank"):
        on_ranks(_rank_1_raises, 2, (2, str(tmp_path / "store"), str(marks)))
    assert {p.name.split("-")[0] for p in marks.iterdir()} <= {"rank0", "rank1"}
    assert len([p for p in marks.iterdir() if p.name.startswith("rank1")]) == 1   # not spawned again
