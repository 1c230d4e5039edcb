"""The metric names the README's ``## Metrics`` section documents, and the keys it does not.

A key is documented when it is backticked in the FIRST cell of a table row of that
section. Two patterns stand for several keys: ``<name>`` for any one path segment
(``rewards/<name>``: ``rewards/math``) and ``q1..q4`` for a numbered range
(``advantage_mean_q1..q4``: ``advantage_mean_q1`` to ``_q4``). Backticks in the prose or
in a row's description name nothing.
"""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Metrics"

# `q1..q4` (the letters before both numbers must agree) or `<name>`.
_PATTERN = re.compile(r"(?P<stem>[a-z]*)(?P<low>\d+)\.\.(?P=stem)(?P<high>\d+)|<[a-z_]+>")
_FIRST_CELL = re.compile(r"^\|([^|]*)\|")


def metrics_section(text):
    """The text of the ``## Metrics`` section, up to the next ``## `` heading."""
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        raise ValueError(f"the README has no {SECTION!r} section")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def key_pattern(documented):
    """A documented name -> the compiled regex that matches every key it stands for."""
    parts, done = [], 0
    for match in _PATTERN.finditer(documented):
        parts.append(re.escape(documented[done:match.start()]))
        if match["low"] is None:   # <name>: one path segment
            parts.append(r"[^/\s]+")
        else:
            numbers = range(int(match["low"]), int(match["high"]) + 1)
            parts.append(re.escape(match["stem"]) + "(?:" + "|".join(map(str, numbers)) + ")")
        done = match.end()
    parts.append(re.escape(documented[done:]))
    return re.compile("".join(parts))


def documented_names(text):
    """The backticked names in the first cell of every table row of the Metrics section."""
    names = []
    for line in metrics_section(text).splitlines():
        cell = _FIRST_CELL.match(line.strip())
        if cell:
            names += re.findall(r"`([^`]+)`", cell.group(1))
    return names


def undocumented(keys, text=None):
    """The sorted keys of `keys` that no documented name of the README (or of `text`) matches."""
    text = README.read_text(encoding="utf-8") if text is None else text
    patterns = [key_pattern(name) for name in documented_names(text)]
    return sorted(k for k in set(keys) if not any(p.fullmatch(k) for p in patterns))
