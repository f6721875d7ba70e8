"""Atomic writes (a reader never sees a half-written file) and the JSON and CSV readers."""
from __future__ import annotations

import csv
import errno
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


class NotWritable(PermissionError):
    """A result file cannot be written because its folder is not writable (permissions, a
    read-only filesystem); the message names the folder and the way out."""


def _not_writable(path: Path, exc: OSError) -> NotWritable:
    folder = path.parent
    while not folder.exists() and folder != folder.parent:   # the folder that refused: the
        folder = folder.parent                               # nearest one that exists
    err = NotWritable(f"cannot write {path.name}: folder {folder} is not writable "
                      f"({exc.strerror or type(exc).__name__}); make it writable for this user, "
                      f"or copy the result set to a writable place and run there")
    err.filename = str(folder)   # the folder that refused, as an OSError names its file
    return err


def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write to a temporary file in the same folder, then rename over the target. A folder that
    cannot be written raises NotWritable, naming it."""
    path = Path(path)
    mode = "wb" if isinstance(text, bytes) else "w"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
            raise _not_writable(path, exc) from None
        raise
    try:
        # mkstemp makes the file 0600; results are for the group too (a shared filesystem),
        # as far as the user's umask allows.
        os.fchmod(fd, 0o644 & ~_umask())
        with os.fdopen(fd, mode) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    try:   # Linux shows it without changing it (other threads may be creating files)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)   # elsewhere reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_json(path: Path | str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path | str) -> Any:
    with open(path) as f:
        return json.load(f)


def write_csv(path: Path | str, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    """Rows are dicts; missing keys are written empty, extra keys are an error (a typo)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    write_atomic(path, buf.getvalue())
