"""Finding the final answer in a completion: the LAST marker decides.

Markers are `\\boxed{...}` (nested braces allowed), GSM8K's `#### X` and XML-style
`<tag>...</tag>`. Only the last marker counts: when it is empty or unclosed the
completion has no answer, and an earlier marker is never used instead, so a model
cannot hedge by writing several answers.
"""

import dataclasses
import re

from grpo_jax.rewards import _normalise

_BOXED = re.compile(r"\\boxed\s*\{")
# A number not glued to a word or to a preceding number: "7-3" ends in 3, "is -5" in -5.
_NUMBER = re.compile(r"(?<![\w.)\]])-?\d+(?:\.\d+)?")


@dataclasses.dataclass(frozen=True)
class Marker:
    """The last marker of one kind in a text.

    Attributes:
      start: index in the text where the marker begins.
      content: the stripped text inside it, or None when it is empty or unclosed.
    """

    start: int
    content: str | None


def _nonempty(text: str) -> str | None:
    text = text.strip()
    return text or None


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing a group whose `{` ends just before `start`; escaped braces are text."""
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
    """`\\boxed{X}` inside a box becomes X."""
    while match := _BOXED.search(text):
        end = _closing_brace(text, match.end())
        if end is None:  # only with unbalanced escaped braces; leave the text as written
            return text
        text = text[: match.start()] + text[match.end() : end] + text[end + 1 :]
    return text


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
            return Marker(match.start(), None)
        last = Marker(match.start(), _nonempty(_unwrap_boxes(text[match.end() : end])))
        position = end + 1
    return last


def last_hash_answer(text: str) -> Marker | None:
    """GSM8K's last `#### X`: X is the rest of that line; None if there is no `####`."""
    start = text.rfind("####")
    if start < 0:
        return None
    return Marker(start, _nonempty(text[start + 4 :].split("\n", 1)[0]))


def last_tag(text: str, tag: str) -> Marker | None:
    """The last `<tag>...</tag>`; None if `<tag>` never opens, no content if it never closes."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    start = text.rfind(opener)
    if start < 0:
        return None
    end = text.find(closer, start + len(opener))
    if end < 0:
        return Marker(start, None)
    return Marker(start, _nonempty(text[start + len(opener) : end]))


def last_number(text: str) -> str | None:
    """The last number written in digits (any script), thousands separators removed."""
    numbers = _NUMBER.findall(_normalise.normalise_digits(text))
    return numbers[-1] if numbers else None


def final_boxed_answer(completion: str) -> str | None:
    """A MATH-style final answer: the content of the last `\\boxed{}`; no box, no answer."""
    marker = last_boxed(completion)
    return marker.content if marker else None


def final_gsm8k_answer(completion: str) -> str | None:
    """A GSM8K final answer: the later of the last `#### X` and the last `\\boxed{}`;
    without either marker, the last number in the text."""
    markers = [m for m in (last_hash_answer(completion), last_boxed(completion)) if m]
    if markers:
        return max(markers, key=lambda m: m.start).content
    return last_number(completion)
