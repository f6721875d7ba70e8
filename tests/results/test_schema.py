"""dpbench.results.schema and read_table: one schema a table, typed reads, damaged tables named."""
from __future__ import annotations

import pytest

from dpbench import results


def test_every_table_has_one_schema_and_reads_back_typed(tmp_path):
    assert results.TABLES == {n: s.columns for n, s in results.SCHEMAS.items()}
    path = results.table_path(tmp_path, "t", "summary")
    results.write_csv(path, results.TABLES["summary"],
                      [{"run_id": "ddp-g2-r0", "variant": "ddp", "gpus": 2, "repeat": 0, "status": "ok",
                        "deterministic": True, "images_per_s": 10.5}])
    df = results.read_table(tmp_path, "t", "summary", require=["run_id", "gpus", "images_per_s"])
    assert df.loc[0, "options"] == "" and df.loc[0, "gpus"] == 2
    typed = results.SCHEMAS["summary"].typed(df)
    assert typed.loc[0, "deterministic"] is True or typed.loc[0, "deterministic"] == True  # noqa: E712
    assert typed["seed"].isna().all()


@pytest.mark.parametrize("text, require", [
    ("", ["run_id"]),
    ("run_id,gpus\nddp-g2-r0,2\n", ["run_id", "images_per_s"]),
    ("run_id,gpus\nddp-g2-r0,two\n", ["gpus"]),
    ("run_id,gpus\nddp-g2-r0,\n", ["gpus"]),
])
def test_a_damaged_table_names_its_file(tmp_path, text, require):
    path = results.table_path(tmp_path, "t", "summary")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(results.TableError) as err:
        results.read_table(tmp_path, "t", "summary", require=require)
    assert str(path) in str(err.value)   # the file is named; the wording is the message's
