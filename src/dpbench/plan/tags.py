"""Whether a tag can name a result set: one folder's name under results_dir, safe in file
names, logs and the rules' command lines."""
from __future__ import annotations

from typing import Any

TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-")
TAG_MAX = 100   # one folder's name, with room under the file system's 255 for what dpbench adds
TAG_RULE = f"letters, digits and ._+- only, at most {TAG_MAX} characters, no leading '.' and no '..'"


def tag_problem(tag: Any, key: str = "tag") -> str | None:
    """Why `tag` is not a result set's name (one folder under results_dir), or None. A tag is
    letters, digits and `._+-` (it reaches file names, logs and the rules' command lines), at
    most TAG_MAX characters; a leading dot would hide it, '..' would leave results_dir."""
    if not isinstance(tag, str) or tag == "":
        return None   # not a string: the schema says so; empty: the default tag
    bad_char = next((c for c in tag if c not in TAG_CHARS), None)
    bad = (f"{len(tag)} characters" if len(tag) > TAG_MAX
           else "a path separator" if bad_char in ("/", "\\")
           else "white space" if bad_char is not None and bad_char.isspace()
           else f"the character {bad_char!r}" if bad_char is not None
           else "'..'" if ".." in tag else "a leading '.'" if tag.startswith(".") else None)
    if bad is None:
        return None
    shown = tag if len(tag) <= 40 else tag[:37] + "..."
    return (f"config key {key}: {shown!r} has {bad}; a tag is one folder's name under results_dir: "
            f"{TAG_RULE} (e.g. {key}=quick or {key}=torch-2.14.1)")
