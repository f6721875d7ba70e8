"""How a failure reads in a record, a log or a probe: one line, the way a user sees it."""
from __future__ import annotations


def error_text(exc: BaseException) -> str:
    """`Type: first line of the message`, the way a user sees it at the top of a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip()
