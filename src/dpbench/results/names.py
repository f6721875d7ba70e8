"""The names inside a result set: its files, its figures, a run's statuses."""
from __future__ import annotations

METRICS = "metrics.json"
STEPS = "steps.csv"
PROVENANCE = "provenance.json"
SUMMARY_MD = "summary.md"
CLAIMS_MD, CLAIMS_JSON = "claims.md", "claims.json"
REPORT_HTML = "report.html"
COMPARE_DIR = "compare"

# The pipeline's figures (file stems under figures/, in drawing order). Planning needs the
# names without drawing anything: plots.py draws exactly these.
FIGURE_NAMES = ("throughput", "scaling_efficiency", "memory", "loss_curves", "loss_vs_single",
                "accuracy", "warnings")
# The sharded variants' figures (report/sharding_plots.py draws exactly these), drawn where the
# plan has sharded runs.
SHARDING_FIGURE_NAMES = ("memory_components", "sharding_vs_size")
# The largest batch per variant and model size (C9's search, issue 26), where a set has it.
# The claims ledger's own figures: key -> file name (claim_<key>.png); a key's claim is the part
# before "_" (C8_dp_step belongs to C8). claims/figures.py draws exactly these.
CLAIM_FIGURE_KEYS = ("C1", "C6", "C7", "C8", "C8_dp_step", "C9")

STATUS_OK, STATUS_FAILED, STATUS_SKIPPED = "ok", "failed", "skipped"
# In a failed row's reason: collect could not read the run's metrics.json or steps.csv (the file
# is named before it). Compare reads such a row as a broken input (exit 2), never as a result.
DAMAGED_MARK = " is damaged ("
