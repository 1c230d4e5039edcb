"""The bounds on math-verify's work: size measures (hand-computed) and the time limit."""

import os
import signal
import threading
import time

import pytest
import sympy

from grpo_jax.rewards import _limits


def _pow(base, exponent):
    return sympy.Pow(base, exponent, evaluate=False)


def _sums(n):
    """(a0 + b0)(a1 + b1)...: 2**n monomials once expanded."""
    return sympy.Mul(
        *[a + b for a, b in zip(sympy.symbols(f"a0:{n}"), sympy.symbols(f"b0:{n}"))], evaluate=False
    )


x, y, k, n = sympy.symbols("x y k n")


class TestNesting:
    @pytest.mark.parametrize(
        "text, expected",
        [
            ("", (0, 0)),
            ("5", (0, 0)),
            ("(1+2)", (1, 5)),
            ("((1))", (2, 8)),  # 1 + 2 + 2 + 2 + 1
            ("(1)(2)", (1, 6)),
            (")(", (1, 1)),  # a stray closer counts as none
            (r"\{1\}", (1, 4)),  # escaped braces count: they are sets
            ("{" * 5000, (5000, 5000 * 5001 // 2)),
        ],
    )
    def test_nesting(self, text, expected):
        assert _limits.nesting(text) == expected

    @pytest.mark.parametrize(
        "predicted, gold, expected",
        [
            ("x" * 200, "5", True),
            ("x" * 201, "5", False),
            ("x" * 202, "x" * 101, True),  # twice the gold's length
            ("x" * 203, "x" * 101, False),
            ("{" * 5 + "}" * 5, "5", True),  # depth 5, nesting 5 * 6 = 30
            ("{" * 6 + "}" * 6, "5", False),  # depth 6
            ("{" * 6 + "}" * 6, "{" * 3 + "}" * 3, True),  # twice the gold's depth
            ("(" + "1" * 62 + ")", "5", True),  # nesting 64
            ("(" + "1" * 63 + ")", "5", False),  # nesting 65
            ("(" + "1" * 63 + ")", "(" + "1" * 31 + ")", True),  # twice the gold's nesting, 33
        ],
    )
    def test_text_within_limits(self, predicted, gold, expected):
        assert _limits.text_within_limits(predicted, gold) == expected


class TestExpressionLimits:
    @pytest.mark.parametrize(
        "expr, expected",
        [
            (_pow(2, 10), True),
            (_pow(2, 30_000), True),  # 9,031 digits
            (_pow(2, 40_000), False),  # 12,042 digits > MAX_NUMBER_DIGITS
            (_pow(10, -9_000), True),
            (_pow(10, -11_000), False),  # exact 1/10^11000 has 11,001 digits
            (_pow(9, _pow(9, 2)), True),  # 9^81
            (_pow(9, _pow(9, 9)), False),  # 9^387420489
            (_pow(1, _pow(10, 100)), False),  # an exponent past 10^7 is refused whatever the base
            (sympy.factorial(1000, evaluate=False), True),
            (sympy.factorial(3000, evaluate=False), False),  # 3000 * log10(3002) > 10,000
            (sympy.factorial(_pow(10, 10), evaluate=False), False),
            (_pow(x + 1, 63), True),  # 64 monomials
            (_pow(x + 1, 64), False),  # 65 > MAX_EXPANDED_TERMS
            (_pow(x + y + 1, 9), True),  # C(11, 2) = 55
            (_pow(x + y + 1, 10), False),  # C(12, 2) = 66
            (_sums(6), True),  # 64
            (_sums(7), False),  # 128
            (_pow(x, 10**6), True),  # a monomial: nothing to expand
            (_pow(2 * x, 10**6), False),  # 2^1000000 once expanded
            (sympy.Matrix([[1, 2], [3, 4]]), True),
            # a mutable matrix's entries count too
            (sympy.Matrix([[1, _pow(9, _pow(9, 9))]]), False),
            (sympy.FiniteSet(1, _pow(2, 10)), True),
            (sympy.Interval(0, _pow(10, 20_000)), False),
            # Sums and products over a range: n terms of up to (body + index) digits each.
            (sympy.Sum(1 / k, (k, 1, 1000)), True),  # 1000 * log10(1002) = 3,001 digits
            (sympy.Sum(1 / k, (k, 1, 100_000)), False),  # the harmonic number's 10^5 digits
            (sympy.Product(k, (k, 1, 10**6)), False),  # (10^6)!
            (sympy.Product(k, (k, 1, 20)), True),  # 20!: 20 * log10(22) = 27 digits
            (sympy.Sum(k, (k, 1, 10**4)), False),  # 10^4 * log10(10002) = 40,001 digits
            (sympy.Sum(x * k, (k, 1, 64)), True),  # at most 64 monomials
            (sympy.Sum(x * k, (k, 1, 65)), False),  # 65 > MAX_EXPANDED_TERMS
            (sympy.Sum(k, (k, 1, n)), True),  # symbolic limits: costed as the body
        ],
    )
    def test_expression_within_limits(self, expr, expected):
        assert _limits.expression_within_limits([expr, "text"]) == expected

    def test_strings_are_not_measured(self):
        assert _limits.expression_within_limits(["9^{9^{9}}"])

    @pytest.mark.parametrize("answer", [r"\sum_{k=1}^{100000} \frac{1}{k}",
                                        r"\prod_{k=1}^{10^6} k"])
    def test_a_short_sum_or_product_of_a_huge_range_is_refused_not_timed_out(self, answer):
        from grpo_jax.rewards import math_reward, run_contained
        outcome = run_contained(math_reward, ("Q", f"\\boxed{{{answer}}}", {"answer": "3"}), {})
        assert (outcome.value, outcome.status) == (0.0, "ok")   # not a 2 s "timeout"


def _spin(seconds):
    """Burns `seconds` of this process's user CPU time (what ITIMER_VIRTUAL counts),
    however loaded the machine is: Python loops, with the clock read between them."""
    end = os.times().user + seconds
    while os.times().user < end:
        for _ in range(20_000):
            pass


class TestTimeLimit:
    def test_stops_python_code(self):
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="spinning took over 0.05 s of CPU time"):
            with _limits.time_limit(0.05, "spinning"):
                _spin(30)
        assert time.monotonic() - start < 10.0  # stopped, not 30 s

    def test_is_not_swallowed_by_except_exception(self):
        with pytest.raises(TimeoutError):
            with _limits.time_limit(0.05, "stubborn"):
                for _ in range(3000):
                    try:
                        _spin(0.01)
                    except Exception:  # as math-verify does around sympy
                        pass

    def test_counts_cpu_not_waiting(self):
        with _limits.time_limit(0.05, "sleeping"):
            time.sleep(0.2)  # a loaded machine or I/O does not use up the budget

    def test_fast_block_returns_and_leaves_no_timer(self):
        handler = signal.getsignal(signal.SIGVTALRM)
        with _limits.time_limit(1.0, "fast"):
            value = sum(range(100))
        assert value == 4950
        assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGVTALRM) is handler

    def test_outer_timer_is_rearmed_and_still_fires(self):
        fired = []
        previous = signal.signal(signal.SIGVTALRM, lambda signum, frame: fired.append(signum))
        try:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0.3)
            with _limits.time_limit(5.0, "inner"):
                _spin(0.05)
            remaining, _ = signal.getitimer(signal.ITIMER_VIRTUAL)
            assert 0.0 < remaining < 0.3
            # Spin until it fires (on a loaded machine the tick that delivers it can come
            # late), giving up after 5 s of CPU time: the outer timer must still go off.
            give_up = os.times().user + 5.0
            while not fired and os.times().user < give_up:
                _spin(0.01)
            assert fired == [signal.SIGVTALRM]
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, previous)

    def test_outer_deadline_passed_inside_fires_on_exit(self):
        fired = []
        previous = signal.signal(signal.SIGVTALRM, lambda signum, frame: fired.append(signum))
        try:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0.02)
            with _limits.time_limit(5.0, "inner"):
                _spin(0.1)  # past the outer deadline, while the inner timer holds the signal
                assert fired == []
            _spin(0.1)
            assert fired == [signal.SIGVTALRM]
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, previous)

    def test_outside_the_main_thread_it_does_nothing(self):
        outcome = []

        def work():
            try:
                with _limits.time_limit(0.01, "threaded"):
                    _spin(0.1)
                outcome.append("finished")
            except BaseException as error:
                outcome.append(error)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        assert outcome == ["finished"]
        assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)
