"""The results layer's public face (torch-free): every name other layers import from
`dpbench.results`, each defined once in the module that owns its job.

    <root>/<tag>/runs/<run_id>/metrics.json   one run's record (written last, atomically)
    <root>/<tag>/runs/<run_id>/identity.json  the run's ids as its plan decided them (the launcher's copy)
    <root>/<tag>/runs/<run_id>/steps.csv      one row per optimizer step
    <root>/<tag>/plan.json                    the experiment as planned: every run's ids and settings
    <root>/<tag>/{runs,cells}.csv             a row a run (with its cell_id); a row a cell (its statistics)
    <root>/<tag>/{summary,memory,warnings,steps,accuracy,medians}.csv   the other tidy tables
    <root>/<tag>/{memory_components,collectives}.csv   the sharded work's (rows only where recorded)
    <root>/<tag>/provenance.json              where the runs came from (one value, or a list)
    <root>/<tag>/summary.md, claims.md, claims.json, claims/<Cn>.json (probe records), sharding.md
    <root>/<tag>/figures/<name>.png, logs/<name>.log, report.html
    <root>/compare/<baseline>_vs_<candidate>.{md,json}

    names.py       the file, figure and status names      identity.py   run, cell and setup ids
    layout.py      every path; ResultSet; read_table      runs.py       run records read back
    schema.py      the tables' columns and dtypes         formats.py    the record's format, upgrade()
    record.py      the one writer of metrics.json         files.py      atomic writes, JSON, CSV
    provenance.py  provenance.json's values               reference.py  the committed references
"""
# ruff: noqa: F401   (re-exports)
from __future__ import annotations

from dpbench.results.files import NotWritable, read_json, write_atomic, write_csv, write_json
from dpbench.results.formats import (FORMAT, LATER_PHASES, NO_THROUGHPUT, STARTUP_PHASES, RecordFormatError,
                                     planned_per_gpu_batch, planned_scaling, upgrade, workload_name)
from dpbench.results.identity import (IDENTITY, Identity, RunId, cell_id, identity_of, options_label,
                                      parse_run_id, run_id, setup_id, workload_label)
from dpbench.results.layout import (ResultSet, claim_figure_name, compare_dir, compare_paths, figures_dir,
                                    paired_compare_paths, provenance_path, read_table, run_dir, runs_dir,
                                    table_path, tag_dir)
from dpbench.results.names import (CLAIM_FIGURE_KEYS, CLAIMS_JSON, CLAIMS_MD, COMPARE_DIR, DAMAGED_MARK,
                                   FIGURE_NAMES, METRICS, PROVENANCE, REPORT_HTML, SHARDING_FIGURE_NAMES,
                                   STATUS_FAILED, STATUS_OK, STATUS_SKIPPED, STEPS, SUMMARY_MD)
from dpbench.results.provenance import LIST_VALUED_PROVENANCE, gpu_models, provenance_values, widest_gpu_names
from dpbench.results.runs import DamagedRecord, RunRecord, iter_runs, read_metrics, read_run, upgraded
from dpbench.results.schema import (ACCURACY_COLUMNS, CELL_COLUMNS, CELLS_COLUMNS, CLAIM_SCHEMAS,
                                    COLLECTIVE_COLUMNS, LARGEST_BATCH_COLUMNS, LATER_TABLES,
                                    MEMORY_COMPONENT_COLUMNS, MEMORY_COLUMNS, RUN_COLUMNS, RUN_STEP_COLUMNS,
                                    SCHEMAS, STEP_COLUMNS, SUMMARY_COLUMNS, TABLES, TEXT_COLUMNS,
                                    WARNING_COLUMNS, TableError, TableSchema)
