"""C4's probe: the article's load fails, the alternatives round-trip."""

import torch

from dpbench.claims import NUANCE
from dpbench.claims.c4 import probe as c4_probe


def test_c4_article_load_fails_and_alternatives_round_trip_bit_for_bit():
    rec = c4_probe.run()
    article = rec.values("c4.article_load")
    assert article["error"] == "RuntimeError: Error(s) in loading state_dict for DataParallel:"
    assert article["second_line"].startswith('Missing key(s) in state_dict: "module.conv1.weight"')
    assert rec.values("c4.fresh_model_differs")["result"]
    exact = [o for o in rec.observations if "round_trip_bit_exact" in o.values]
    assert len(exact) >= 5 and all(o.get("round_trip_bit_exact") for o in exact)
    assert rec.verdict == NUANCE


def test_c4_identical_sees_one_ulp():
    sd = c4_probe.trained_like().state_dict()
    other = {k: v.clone() for k, v in sd.items()}
    w = other["linear.bias"]
    w[0] = torch.nextafter(w[0], torch.tensor(1e9))
    assert c4_probe.identical(sd, {k: v.clone() for k, v in sd.items()})
    assert not c4_probe.identical(sd, other)
