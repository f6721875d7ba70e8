"""Probe records: observation ids."""

import pytest

from dpbench.claims import REFUTED
from dpbench.claims.records import ProbeRecord, obs


def test_observation_ids_are_unique_in_a_record():
    with pytest.raises(ValueError, match=r"\['a\.b'\]"):   # the repeated id
        ProbeRecord("C3", "t", {}, [obs("a.b", "one"), obs("a.b", "two")], REFUTED, "")
