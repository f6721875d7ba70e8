"""How a failure reads in a record, a log or a probe: one line, the way a user sees it."""
from __future__ import annotations


# A line that ends in one of these words or a comma stops mid-sentence (a wrapped hint).
_GOES_ON = {"a", "an", "and", "as", "at", "by", "for", "from", "in", "is", "of", "on", "or", "that", "the",
            "to", "with"}
_MAX_JOINED = 4   # lines


def _mid_sentence(text: str) -> bool:
    words = text.split()
    return bool(words) and (text.endswith(",") or words[-1].lower() in _GOES_ON)


def first_sentence(message: str) -> str:
    """The message's first line, and where that line breaks mid-sentence (PyTorch wraps its long
    hints: DDP's unused-parameter error breaks after "..., and by"), the lines that finish the
    sentence, joined by spaces: never a hint cut in two. A line continues the sentence when the
    text so far ends in a comma or a word such as "and", "by", "the", and the line starts in lower
    case. At most four lines."""
    lines = str(message).strip().splitlines()
    text = lines[0].rstrip() if lines else ""
    for line in lines[1:_MAX_JOINED]:
        line = line.strip()
        if not (_mid_sentence(text) and line[:1].islower()):
            break
        text = f"{text} {line}"
    return text


def error_text(exc: BaseException) -> str:
    """`Type: first sentence of the message`, the way a user sees it at the top of a traceback
    (the first line, finished where it breaks mid-sentence: first_sentence)."""
    return f"{type(exc).__name__}: {first_sentence(str(exc))}".rstrip()


def message_line(exc: BaseException) -> str:
    """The message's first line alone (the type's name where there is no message): for a reason
    that names its file first and the parser's complaint after it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
