"""The metric names docs/metrics.md documents, and the keys it does not.

The page is one section, headed ``# Metrics`` (its subsections are ``## `` headings). A key
is documented when it is backticked in the FIRST cell of a table row of that section. Two
patterns stand for several keys: ``<name>`` for any one path segment (``rewards/<name>``:
``rewards/math``) and ``q1..q4`` for a numbered range (``advantage_mean_q1..q4``:
``advantage_mean_q1`` to ``_q4``). Backticks in the prose or in a row's description name
nothing. (The module keeps its name from when the section was the README's.)
"""

import pathlib
import re

METRICS_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
SECTION = "# Metrics"

# `q1..q4` (the letters before both numbers must agree) or `<name>`.
_PATTERN = re.compile(r"(?P<stem>[a-z]*)(?P<low>\d+)\.\.(?P=stem)(?P<high>\d+)|<[a-z_]+>")
_FIRST_CELL = re.compile(r"^\|([^|]*)\|")


def metrics_section(text):
    """The lines of the ``# Metrics`` section: from its heading up to the next top-level
    (``# ``) heading outside a code block, or the end of the text."""
    lines = text.splitlines()
    if SECTION not in lines:
        raise ValueError(f"the metrics page has no {SECTION!r} section")
    section, fenced = [], False
    for line in lines[lines.index(SECTION) + 1:]:
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("# ") and not fenced:
            break
        section.append(line)
    return section


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


def first_cell_names(lines):
    """The backticked names in the first cell of every table row among `lines`."""
    names = []
    for line in lines:
        cell = _FIRST_CELL.match(line.strip())
        if cell:
            names += re.findall(r"`([^`]+)`", cell.group(1))
    return names


def documented_names(text):
    """The backticked names in the first cell of every table row of the Metrics section."""
    return first_cell_names(metrics_section(text))


def undocumented(keys, text=None):
    """The sorted keys of `keys` that no documented name of docs/metrics.md (or of `text`)
    matches."""
    text = METRICS_PAGE.read_text(encoding="utf-8") if text is None else text
    patterns = [key_pattern(name) for name in documented_names(text)]
    return sorted(k for k in set(keys) if not any(p.fullmatch(k) for p in patterns))
