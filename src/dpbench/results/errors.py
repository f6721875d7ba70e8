"""How a failure reads in a record, a log or a probe: one line, the way a user sees it."""
from __future__ import annotations


def error_text(exc: BaseException) -> str:
    """`Type: first line of the message`, the way a user sees it at the top of a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip()


def message_line(exc: BaseException) -> str:
    """The message's first line alone (the type's name where there is no message): for a reason
    that names its file first and the parser's complaint after it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
