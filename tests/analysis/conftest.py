"""The analysis tests' shared result set (scaling_runs.SPEC), made once per module."""
from __future__ import annotations

import pytest
from fakes import fake_result_set
from scaling_runs import SPEC


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return fake_result_set(tmp_path_factory.mktemp("tables"), SPEC)
