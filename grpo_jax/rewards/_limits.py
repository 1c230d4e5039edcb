"""Bounds on the work of comparing answers with math-verify, so that every grader returns
in well under a second on any input, in the pool or not.

math-verify's cost grows fast with the answer. Its ANTLR parser re-reads the content of
every bracket while it decides what the bracket opens (a set, a tuple, a group), so it
takes about a second on ten nested braces or on a 200-character parenthesised sum, while
a flat 1,000-character sum parses in milliseconds; and sympy evaluates `9^{9^{9}}` or
`(10^{10})!` as exact integers inside one C call that no signal can interrupt. So a
predicted answer is checked before and after parsing, and the rest runs under a timer:

| bound                 | measures                            | past it                           |
|-----------------------|-------------------------------------|-----------------------------------|
| `MAX_ANSWER_CHARS`    | length                              | scores 0, not parsed              |
| `MAX_DEPTH`           | deepest nesting of `( [ {`          | scores 0, not parsed              |
| `MAX_NESTING`         | characters times the brackets around them | scores 0, not parsed        |
| `MAX_NUMBER_DIGITS`   | digits of any exact number sympy may build (powers, factorials, sums) | scores 0, not compared |
| `MAX_EXPANDED_TERMS`  | monomials of the expanded answer (`(a+b)(c+d)...`, `(x+1)^{n}`) | scores 0, not compared |
| `TIME_LIMIT_S`        | CPU time of parsing and comparing   | `TimeoutError` ("timeout" outcome, 0) |

A gold longer or more nested than the caps raises them to twice its own measures, so a
prediction may always be written like the gold. Golds come from the dataset and are
trusted: only the timer applies to them. The timer is a signal, so it acts in the main
thread only (where `score_batch` and the pool's workers call graders); in another thread
the size bounds alone hold, and they keep any answer to a fraction of a second of work.
"""  # noqa: E501 (a table: rows stay whole)

import contextlib
import math
import signal
import threading
import time

import sympy

MAX_ANSWER_CHARS = 200
MAX_DEPTH = 5
MAX_NESTING = 64
MAX_NUMBER_DIGITS = 10_000
MAX_EXPANDED_TERMS = 64
# The timer is the last resort, never the verdict on an answer within the caps: the costliest
# such answer (superscripts at the depth cap) takes ~0.5 s of CPU on an idle 2-core machine
# and was charged 1.1-1.6 s on a loaded virtual machine, so the limit sits above that.
TIME_LIMIT_S = 2.0

_LOG10_2 = math.log10(2)
_FACTORIALS = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.binomial, sympy.gamma)
_OPENERS, _CLOSERS = "([{", ")]}"


def nesting(text: str) -> tuple[int, int]:
    """(deepest, total): the deepest nesting of brackets `( [ {` (escaped or not), and the
    sum over characters of the brackets open around them, the look-ahead math-verify's
    parser pays. A stray closer counts as none.

    Example:
      >>> nesting("(1+2)"), nesting("((1))"), nesting(r"\\left( 3, \\frac{\\pi}{2} \\right)")
      ((1, 5), (2, 8), (2, 34))
    """
    depth = deepest = total = 0
    for char in text:
        if char in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        total += depth
        if char in _CLOSERS:
            depth = max(depth - 1, 0)
    return deepest, total


def text_within_limits(predicted: str, gold: str) -> bool:
    """Whether a predicted answer is short and flat enough to parse (module table)."""
    (deepest, total), (gold_deepest, gold_total) = nesting(predicted), nesting(gold)
    return (
        len(predicted) <= max(MAX_ANSWER_CHARS, 2 * len(gold))
        and deepest <= max(MAX_DEPTH, 2 * gold_deepest)
        and total <= max(MAX_NESTING, 2 * gold_total)
    )


def _magnitude(expr: sympy.Basic, digits: float) -> float:
    """|value| of a numeric expression, evaluated only when `digits` (its `_cost`) is at
    most 7, so cheaply; inf otherwise, or when it has no finite value."""
    if digits > 7:
        return math.inf
    try:
        value = abs(complex(expr.evalf(15)))
    except (TypeError, ValueError, ArithmeticError):  # zoo, nan, an unevaluable function
        return math.inf
    return value if math.isfinite(value) else math.inf


def _monomials(terms: float, power: float) -> float:
    """Monomials of (a sum of `terms` terms)^power once expanded: C(power + terms - 1, power)."""
    if terms <= 1 or power < 1:
        return terms
    if math.isinf(terms) or math.isinf(power):
        return math.inf
    power = math.floor(power)
    log_count = math.lgamma(power + terms) - math.lgamma(terms) - math.lgamma(power + 1)
    return math.inf if log_count > 700 else float(round(math.exp(log_count)))


def _series_cost(expr: sympy.Basic) -> tuple[float, float]:
    """`_cost` of a `sympy.Sum` or `sympy.Product` with numeric limits: sympy evaluates it
    term by term, n terms (the product of each limit's span), each a body whose numbers
    grow with the index, so its exact value has up to n (body digits + digits of the
    largest index) digits (a harmonic sum's common denominator, a factorial), and it
    expands to n times the body's monomials. Symbolic limits cost as any expression."""
    body_digits, body_terms = _cost(expr.function)
    indices = {limit[0] for limit in expr.limits}
    if not expr.function.free_symbols - indices:   # a number: nothing to expand
        body_terms = 0.0   # the sum (product) is one number, whatever its count
    count, largest = 1.0, 0.0
    for _, lower, upper in expr.limits:
        if not (lower.is_number and upper.is_number):
            return math.inf if math.isinf(body_digits) else body_digits, body_terms
        (low_digits, _), (high_digits, _) = _cost(lower), _cost(upper)
        low, high = _magnitude(lower, low_digits), _magnitude(upper, high_digits)
        if math.isinf(low) or math.isinf(high):
            return math.inf, math.inf
        count *= abs(high - low) + 1
        largest = max(largest, low, high)
    return count * (body_digits + math.log10(largest + 2)), max(1.0, count * body_terms)


def _cost(expr: sympy.Basic) -> tuple[float, float]:
    """(digits, terms): upper bounds on the decimal digits of the exact numbers sympy may
    build when it evaluates `expr`, and on the monomials of its expansion."""
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        return _series_cost(expr)
    if isinstance(expr, sympy.Rational):
        return math.log10(max(abs(expr.p), 1)) + math.log10(expr.q), 1.0
    if isinstance(expr, sympy.Float):
        _, _, exponent, bits = expr._mpf_
        return (abs(bits) + abs(exponent)) * _LOG10_2, 1.0
    costs = [_cost(arg) for arg in expr.args if isinstance(arg, sympy.Basic)]
    digits = sum(d for d, _ in costs)
    if expr.is_Add:
        return digits, sum(t for _, t in costs)
    if expr.is_Mul:
        return digits, math.prod(t for _, t in costs)
    if expr.is_Pow and expr.exp.is_number:
        (base_digits, base_terms), (exp_digits, _) = costs
        power = _magnitude(expr.exp, exp_digits)
        if math.isinf(power):
            return math.inf, math.inf
        return base_digits * max(1.0, power) + exp_digits, _monomials(base_terms, power)
    if isinstance(expr, _FACTORIALS) and expr.is_number:
        n = max(_magnitude(arg, d) for arg, (d, _) in zip(expr.args, costs))
        return digits + n * math.log10(n + 2), 1.0
    return digits, max(1.0, sum(t for _, t in costs))


def expression_within_limits(parsed: list) -> bool:
    """Whether sympy can evaluate and expand a parsed answer (math-verify's list) cheaply.

    Example:
      >>> expression_within_limits([sympy.Pow(9, sympy.Pow(9, 9, evaluate=False), evaluate=False)])
      False
    """
    for expr in parsed:
        if isinstance(expr, sympy.MatrixBase):  # math-verify's matrices are mutable, not Basic
            expr = sympy.Tuple(*expr)
        if isinstance(expr, sympy.Basic):
            digits, terms = _cost(expr)
            if not (digits <= MAX_NUMBER_DIGITS and terms <= MAX_EXPANDED_TERMS):
                return False
    return True


class _Expired(BaseException):
    """The timer went off; a BaseException, so math-verify's `except Exception` lets it through."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """Raises TimeoutError when the block uses more than `seconds` of CPU time.

    A SIGVTALRM timer on the process's user CPU time (`setitimer(ITIMER_VIRTUAL)`, so
    sub-second): the verdict on an answer does not depend on how loaded the machine is,
    and the pool's wall-clock budget stays the outer bound. The count covers all of the
    process's threads, so it runs early while other threads compute (not in the pool's
    workers, which run nothing else). Main thread only; elsewhere
    the block runs unbounded. Python code is stopped between bytecodes; one long C call
    is not, which is what the size bounds are for. A timer already running gets its
    handler back and is re-armed with the time it had left.
    """
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "setitimer")):
        yield
        return

    def expire(signum, frame):
        raise _Expired

    previous_handler = signal.signal(signal.SIGVTALRM, expire)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    start = time.process_time()
    try:
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    except _Expired:
        raise TimeoutError(f"{what} took over {seconds} s of CPU time") from None
    finally:
        signal.signal(
            signal.SIGVTALRM, signal.SIG_DFL if previous_handler is None else previous_handler
        )
        if outer_delay:
            remaining = max(outer_delay - (time.process_time() - start), 1e-3)
            signal.setitimer(signal.ITIMER_VIRTUAL, remaining, outer_interval)
