"""Finding the final answer in a completion: the LAST marker decides.

Markers are `\\boxed{...}` (nested braces allowed), GSM8K's `#### X` and XML-style
`<tag>...</tag>`. Only the last marker counts: when it is empty or unclosed the
completion has no answer, and an earlier marker is never used instead, so a model
cannot hedge by writing several answers.

Every scan here is one linear pass, so a completion of any length (10,000 nested
braces, a thousand nested boxes, `####` repeated) is read in milliseconds; bounds on
what an extracted answer may cost to compare live in `_limits`.
"""

import dataclasses
import re
from typing import Literal

from grpo_jax.rewards import _normalise

_BOXED = re.compile(r"\\boxed\s*\{")
# What `_unwrap_boxes` reacts to: a box opener, an escaped character, a brace.
_BOX_TOKEN = re.compile(r"\\boxed\s*\{|\\.|[{}]", re.DOTALL)
# A number not glued to a word or to a preceding number: "7-3" ends in 3, "is -5" in -5.
_NUMBER = re.compile(r"(?<![\w.)\]])-?\d+(?:\.\d+)?")


@dataclasses.dataclass(frozen=True)
class Marker:
    """The last marker of one kind in a text.

    Attributes:
      start: index in the text where the marker begins.
      content: the stripped text inside it, or None when it is empty or unclosed.
      kind: "boxed" (LaTeX math), "hash" (GSM8K's `####`, prose) or "tag" (`<tag>`).
    """

    start: int
    content: str | None
    kind: Literal["boxed", "hash", "tag"]


def _nonempty(text: str) -> str | None:
    text = text.strip()
    return text or None


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing the group whose `{` ends before `start`; escaped braces are text."""
    depth = 1
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # `\{` and `\}` are literal braces, not grouping
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _unwrap_boxes(text: str) -> str:
    """`\\boxed{X}` inside a box becomes X, in one pass (boxes nested any depth)."""
    pieces = []
    closes_box = []  # one entry per open group: does its `}` close a box?
    position = 0
    for match in _BOX_TOKEN.finditer(text):
        pieces.append(text[position : match.start()])
        position = match.end()
        token = match.group()
        if token == "{":
            closes_box.append(False)
        elif token == "}":
            if not closes_box:  # only with unbalanced escaped braces; leave the text as written
                return text
            if closes_box.pop():
                continue  # a box's closing brace goes
        elif token.startswith("\\boxed"):
            closes_box.append(True)
            continue  # and so does its opener
        pieces.append(token)
    if closes_box:
        return text
    pieces.append(text[position:])
    return "".join(pieces)


def last_boxed(text: str) -> Marker | None:
    """The last top-level `\\boxed{...}`, or None if there is none.

    Boxes nested inside the last one are unwrapped (`\\boxed{\\boxed{5}}` answers 5).
    An unclosed box swallows the rest of the text, so it is the last marker and has
    no content.

    Example:
      >>> last_boxed(r"\\boxed{1} then \\boxed{\\frac{1}{2}}").content
      '\\\\frac{1}{2}'
    """
    last = None
    position = 0
    while match := _BOXED.search(text, position):
        end = _closing_brace(text, match.end())
        if end is None:
            return Marker(match.start(), None, "boxed")
        last = Marker(match.start(), _nonempty(_unwrap_boxes(text[match.end() : end])), "boxed")
        position = end + 1
    return last


def last_hash_answer(text: str) -> Marker | None:
    """GSM8K's last `#### X`: X is the rest of that line; None if there is no `####`."""
    start = text.rfind("####")
    if start < 0:
        return None
    return Marker(start, _nonempty(text[start + 4 :].split("\n", 1)[0]), "hash")


def last_tag(text: str, tag: str) -> Marker | None:
    """The last `<tag>...</tag>`; None if `<tag>` never opens, no content if it never closes."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    start = text.rfind(opener)
    if start < 0:
        return None
    end = text.find(closer, start + len(opener))
    if end < 0:
        return Marker(start, None, "tag")
    return Marker(start, _nonempty(text[start + len(opener) : end]), "tag")


def last_number(text: str) -> str | None:
    """The last number written in digits (any script), thousands separators removed."""
    numbers = _NUMBER.findall(_normalise.normalise_digits(text))
    return numbers[-1] if numbers else None


def final_boxed_answer(completion: str) -> str | None:
    """A MATH-style final answer: the content of the last `\\boxed{}`; no box, no answer."""
    marker = last_boxed(completion)
    return marker.content if marker else None


def final_gsm8k_marker(completion: str) -> Marker | None:
    """The later of the last `#### X` and the last `\\boxed{}`, or None without either."""
    markers = [m for m in (last_hash_answer(completion), last_boxed(completion)) if m]
    return max(markers, key=lambda m: m.start) if markers else None


def final_gsm8k_answer(completion: str) -> str | None:
    """A GSM8K final answer: the later of the last `#### X` and the last `\\boxed{}`;
    without either marker, the last number in the text."""
    marker = final_gsm8k_marker(completion)
    return marker.content if marker else last_number(completion)
