"""The bundled tools and the tag convention of `ToolEnvironment`."""

import pytest

from grpo_jax import environments
from grpo_jax.environments import Step, ToolEnvironment, calculator, countdown_check
from tests.doctest_numbers import run_examples

CALC = ToolEnvironment(tools={"calculator": calculator, "check": countdown_check}, max_calls=2)
EXAMPLE = {"numbers": [25, 6, 2, 9], "target": 100}


@pytest.mark.parametrize("expression, value", [
    ("(478 + 256) * 12", "8808"), ("7/2", "7/2"), ("10 - 3 * 4", "-2"), ("6 / 4", "3/2"),
    (" 99999999999 * 99999999999 ", str(99999999999 ** 2)),
])
def test_the_calculator_is_exact(expression, value):
    assert calculator(expression, {}) == value


@pytest.mark.parametrize("expression, error", [
    ("2 ** 9", "error: "), ("1 / 0", "error: division by zero"), ("abs(3)", "error: "),
    ("9" * 110 + "*" + "9" * 110, "error: the result has more than 200 digits"),
])
def test_the_calculator_answers_bad_input_with_an_error(expression, error):
    assert calculator(expression, {}).startswith(error)


def test_the_countdown_check_says_what_an_expression_is_worth():
    assert countdown_check("(6 - 2) * 25", EXAMPLE) == "100 (reaches the target)"
    assert countdown_check("25 * 2 + 9", EXAMPLE) == "59 (not the target)"
    assert countdown_check("25 * 25", EXAMPLE) == "error: 25 is used more often than given"
    assert countdown_check("7 + 1", EXAMPLE) == "error: 1 is used more often than given"


@pytest.mark.parametrize("turn, call", [
    ("let me see <calculator>12*3</calculator>", ("calculator", "12*3")),
    ("<check>(6-2)*25</check>  ", ("check", "(6-2)*25")),
    ("<calculator>1+1</calculator> and more", None),       # the turn goes on: not its end
    ("a > b", None), ("<calculator>1</check>", None), ("<unknown>1</unknown>", None),
    ("<calculator>1 <calculator>2</calculator>", ("calculator", "2")),   # the innermost call
])
def test_a_call_is_a_tool_tag_that_ends_the_turn(turn, call):
    assert CALC.call(turn) == call
    assert CALC.ends_turn(turn) == (call is not None)


def test_steps_run_the_tool_and_stop_past_max_calls():
    step = CALC.step(EXAMPLE, ["<check>(6-2)*25</check>"])
    assert step == Step(observation="<result>100 (reaches the target)</result>", tool_call=True)
    bad = CALC.step(EXAMPLE, ["x", "<calculator>2**9</calculator>"])
    assert bad.tool_error and bad.observation.startswith("<result>error: ")
    assert CALC.step(EXAMPLE, ["a", "b", "<calculator>1</calculator>"]) == Step(
        done=True, tool_call=True, tool_error=True)
    assert CALC.failed("timeout", "over 10 s") == Step(
        observation="<result>error: the tool timed out</result>", tool_call=True, tool_error=True)


def test_an_environment_without_a_step_says_what_to_define():
    with pytest.raises(
        NotImplementedError, match=r"Environment must define step\(example, turns\)"
    ):
        environments.Environment().step({}, ["x"])


def test_tool_names_must_be_tag_names():
    with pytest.raises(ValueError, match=r"tool names \['my tool'\] are not tag names"):
        ToolEnvironment(tools={"my tool": calculator})
    assert environments.TOOLS == {"calculator": calculator, "check": countdown_check}


def test_docstring_examples():
    from grpo_jax.environments import _tools
    from grpo_jax.sampling import _engine
    for module in (_tools, _engine):
        result = run_examples(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_a_calculator_target_holds_the_reply_the_environment_gives():
    """The arithmetic task's tool-calling SFT target is the episode the environment makes:
    its call, then exactly the calculator environment's reply, then the answer."""
    from grpo_jax.data import arithmetic
    example = arithmetic.make_example(478, "*", 256, scratchpad=True, forget=lambda: False,
                                      calculator=True)
    solution = example["solution"]
    assert solution == "<calculator>478*256</calculator><result>122368</result> #### 122368"
    environment = environments.make("calculator", max_calls=2)
    turn = solution[:solution.index("</calculator>") + len("</calculator>")]
    assert environment.ends_turn(turn)
    reply = environment.step(example, [turn])
    assert solution == turn + reply.observation + " #### " + example["answer"]
    assert reply.tool_call and not reply.tool_error


def test_registered_environments_are_made_by_name():
    assert environments.make("countdown", max_calls=3) == ToolEnvironment(
        tools={"check": countdown_check}, max_calls=3)
    with pytest.raises(ValueError, match=r"environment.name='calc' is not one of \['calculator', "
                                         r"'countdown'\]"):
        environments.make("calc", max_calls=1)
