"""Rewriting answers so that math-verify reads them at their value.

math-verify (probed on 0.9.0) already handles `\\text{cm}` units, `\\$5`, `\\dfrac` and
plain `1,000`, but misreads other ways models write numbers:

| written        | math-verify alone            | after `normalise_answer` |
|----------------|------------------------------|--------------------------|
| `10\\,080`      | 90 (reads `10\\,0` then `80`)  | 10080                    |
| `５`, `٥`       | nothing parsed               | 5                        |
| `50\\%`         | 0.5, and equal to 0.5        | 50 (`%` is dropped)      |
| `5.` in a box  | the string '5.'              | 5                        |

Integers are compared as digit strings (`canonical_integer`), never through `int()` or
sympy, so golds past Python's 4300-digit int-string limit compare exactly.
"""

import re
import unicodedata

_NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")  # \d matches every Unicode decimal digit
_UNICODE_MINUS = "\u2212"
# Between digit groups of three: LaTeX thin spaces, `{,}`, and Unicode thin or no-break spaces.
_SPACED_THOUSANDS = re.compile(
    r"(?<=\d)(?:\\,|\\!|\\ |~|\{,\}|[\u2009\u202f\u00a0])(?=\d{3}(?!\d))"
)
_COMMA_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d])")
_DOLLAR = re.compile(r"\\?\$")
_PERCENT = re.compile(r"\\?%")
_INTEGER = re.compile(r"([+-]?)0*([0-9]+)")


def normalise_digits(text: str) -> str:
    """Unicode digits and minus sign to ASCII; thousands separators removed.

    Example:
      >>> normalise_digits("١٢ and ３,０００ and 10\\\\,080 and \u22125")
      '12 and 3000 and 10080 and -5'
    """
    text = _NON_ASCII_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())), text)
    text = text.replace(_UNICODE_MINUS, "-")
    text = _SPACED_THOUSANDS.sub("", text)
    return _COMMA_THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)


def normalise_answer(answer: str) -> str:
    """An extracted answer rewritten for math-verify: digits as above, no `$`, no `%`
    (so `50%` is 50, not 0.5), no trailing period.

    Example:
      >>> normalise_answer("\\\\$1,000.")
      '1000'
    """
    answer = _PERCENT.sub("", _DOLLAR.sub("", normalise_digits(answer)))
    return answer.strip().rstrip(".").strip()


def canonical_integer(text: str) -> str | None:
    """`text` as a canonical integer string (no `+`, no leading zeros, `-0` is `0`), or None
    when it is not an optional sign and ASCII digits only. Any length: no `int()` is built.

    Example:
      >>> canonical_integer("+007"), canonical_integer("-0"), canonical_integer("7.0")
      ('7', '0', None)
    """
    match = _INTEGER.fullmatch(text)
    if match is None:
        return None
    sign, digits = match.groups()
    return digits if sign != "-" or digits == "0" else "-" + digits
