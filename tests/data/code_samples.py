"""A few rows of MBPP and APPS in their published file formats (field names, nesting and
types as released; see grpo_jax.data.mbpp and grpo_jax.data.apps).

MBPP's rows 2, 11, 600 and 602 are MBPP's own (CRLF line ends in ``code``, as in
``mbpp.jsonl``); row 700 is written here in that schema with a ``test_setup_code``. The
APPS rows are written here in codeparrot/apps' schema (``solutions`` and ``input_output``
JSON strings): honest problems of each test form, and hostile or malformed rows that the
builder must skip or bound.
"""

import gzip
import json
import pathlib

MBPP = [
    {"text": "Write a function to find the similar elements from the given two tuple lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & "
             "set(test_tup2))\r\n  return (res) ",
     "task_id": 2, "test_setup_code": "",
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"],
     "challenge_test_list": []},
    {"text": "Write a python function to remove first and last occurrence of a given character "
             "from the string.",
     "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch):"
             " \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in "
             "range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n            s = s[0 : i]"
             " + s[i + 1:] \r\n            break\r\n    return s ",
     "task_id": 11, "test_setup_code": "",
     "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"",
                   "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
                   "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
     "challenge_test_list": ["assert remove_Occ(\"hellolloll\",\"l\") == \"helollol\"",
                             "assert remove_Occ(\"\",\"l\") == \"\""]},
    {"text": "Write a python function to check whether the given number is even or not using "
             "bitwise operator.",
     "code": "def is_Even(n) : \r\n    if (n^1 == n+1) :\r\n        return True; \r\n    else :"
             "\r\n        return False; ",
     "task_id": 600, "test_setup_code": "",
     "test_list": ["assert is_Even(1) == False", "assert is_Even(2) == True",
                   "assert is_Even(3) == False"],
     "challenge_test_list": []},
    {"text": "Write a python function to find the first repeated character in a given string.",
     "code": "def first_repeated_char(str1):\r\n  for index,c in enumerate(str1):\r\n    if "
             "str1[:index+1].count(c) > 1:\r\n      return c \r\n  return \"None\"",
     "task_id": 602, "test_setup_code": "",
     "test_list": ["assert first_repeated_char(\"abcabc\") == \"a\"",
                   "assert first_repeated_char(\"abc\") == \"None\"",
                   "assert first_repeated_char(\"123123\") == \"1\""],
     "challenge_test_list": []},
    {"text": "Write a function to find the area of a circle of radius r.",
     "code": "import math\r\ndef circle_area(r):\r\n  return math.pi * r * r",
     "task_id": 700, "test_setup_code": "import math",
     "test_list": ["assert math.isclose(circle_area(1), 3.14159, rel_tol=1e-4)",
                   "assert math.isclose(circle_area(2), 12.56637, rel_tol=1e-4)"],
     "challenge_test_list": []},
]

# sanitized-mbpp.json: a JSON list; "prompt" for "text", "test_imports" for the setup; a
# problem of each split (TFDS refuses an empty split).
MBPP_SANITIZED = [
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 2,
     "prompt": "Write a function to find the shared elements from the given two lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & "
             "set(test_tup2))\n  return (res) ",
     "test_imports": [],
     "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                   "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 11,
     "prompt": "Write a python function to remove first and last occurrence of a given "
               "character from the string.",
     "code": "def remove_Occ(s,ch): \n    for i in range(len(s)): \n        if (s[i] == ch): "
             "\n            s = s[0 : i] + s[i + 1:] \n            break\n    for i in "
             "range(len(s) - 1,-1,-1):  \n        if (s[i] == ch): \n            s = s[0 : i] "
             "+ s[i + 1:] \n            break\n    return s ",
     "test_imports": [],
     "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\""]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 600,
     "prompt": "Write a python function to check whether the given number is even or not.",
     "code": "def is_Even(n) : \n    if (n^1 == n+1) :\n        return True; \n    else :"
             "\n        return False; ",
     "test_imports": [],
     "test_list": ["assert is_Even(1) == False", "assert is_Even(2) == True"]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 700,
     "prompt": "Write a function to find the area of a circle of radius r.",
     "code": "import math\ndef circle_area(r):\n  return math.pi * r * r",
     "test_imports": ["import math"],
     "test_list": ["assert math.isclose(circle_area(1), 3.14159, rel_tol=1e-4)"]},
]


def apps_row(problem_id, question, solutions, tests, *, difficulty="introductory",
             starter_code=""):
    """A codeparrot/apps row: `solutions` and `tests` are JSON-encoded as published."""
    return {"problem_id": problem_id, "question": question,
            "solutions": json.dumps(solutions) if solutions is not None else "",
            "input_output": tests if isinstance(tests, str) else json.dumps(tests),
            "difficulty": difficulty,
            "url": f"https://codeforces.com/problemset/problem/{problem_id}/A",
            "starter_code": starter_code}


SUM = apps_row(
    0, "You are given two integers a and b on one line. Print a + b.",
    ["a, b = map(int, input().split())\nprint(a + b)\n", "print(sum(map(int, input().split())))"],
    {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]})
# Codewars' form: fn_name, outputs wrapped in a list.
PRODUCT = apps_row(
    1, "Return the product of the numbers in the list `xs` (1 for an empty list).",
    ["def multiply_all(xs):\n    p = 1\n    for x in xs:\n        p *= x\n    return p\n"],
    {"fn_name": "multiply_all", "inputs": [[[1, 2, 3]], [[]], [[-2, 5]]],
     "outputs": [[6], [1], [-10]]},
    starter_code="def multiply_all(xs):\n\t")
# LeetCode's form: a method of Solution, annotations that need APPS's imports.
TWO_SUM = apps_row(
    2, "Given an array of integers nums and an integer target, return indices of the two "
       "numbers such that they add up to target.",
    ["class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
     "        seen = {}\n        for i, x in enumerate(nums):\n"
     "            if target - x in seen:\n                return [seen[target - x], i]\n"
     "            seen[x] = i\n"],
    {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
     "outputs": [[0, 1], [1, 2]]},
    difficulty="interview",
    starter_code="class Solution:\n    def twoSum(self, nums: List[int], target: int) -> "
                 "List[int]:\n        ")
# Outputs given as lists of lines; 40 cases, more than the bound the tests set.
LINES = apps_row(
    3, "Read n and print the numbers 1 to n, one per line.",
    ["n = int(input())\nfor i in range(1, n + 1):\n    print(i)\n"],
    {"inputs": [f"{n}\n" for n in range(1, 41)],
     "outputs": [[str(i) for i in range(1, n + 1)] for n in range(1, 41)]},
    difficulty="competition")
# One case of 200,000 characters (over the bound the tests set) beside a small one.
HUGE_CASE = apps_row(
    4, "Print the length of the line read.",
    ["print(len(input()))\n"],
    {"inputs": ["ab\n", "x" * 200_000 + "\n"], "outputs": ["2\n", "200000\n"]})
NO_SOLUTION = apps_row(5, "Print 42.", None, {"inputs": [""], "outputs": ["42\n"]})
DUPLICATE = dict(SUM, problem_id=6, question=" you are given two integers a and b on one "
                                             "line; print a+b. ")
BAD_JSON = apps_row(7, "Print 1.", ["print(1)"], '{"inputs": ["\\n"], "outputs": [')
MISMATCHED = apps_row(8, "Print 2.", ["print(2)"], {"inputs": ["", ""], "outputs": ["2\n"]})
BAD_NAME = apps_row(9, "Return 3.", ["def f():\n    return 3\n"],
                    {"fn_name": "f(); import os", "inputs": [[]], "outputs": [[3]]})
NO_CASE = apps_row(10, "Print 4.", ["print(4)"], {"inputs": [7], "outputs": [None]})
MISSING_FIELD = {k: v for k, v in apps_row(11, "Print 5.", ["print(5)"],
                                           {"inputs": [""], "outputs": ["5\n"]}).items()
                 if k != "input_output"}
# MBPP's task 11, copied into APPS with other spacing and case: contaminated.
COPIED = apps_row(
    12, "Write a Python function to remove first and last occurrence of a given character "
        "from the string!",
    ["s, ch = input().split()\nprint(s)\n"], {"inputs": ["hello l\n"], "outputs": ["heo\n"]})
APPS_TRAIN = [SUM, PRODUCT, TWO_SUM, LINES, HUGE_CASE, NO_SOLUTION, DUPLICATE, BAD_JSON,
              MISMATCHED, BAD_NAME, NO_CASE, MISSING_FIELD, COPIED]
APPS_TEST = [apps_row(4000, "Print the larger of the two integers on the line.",
                      ["print(max(map(int, input().split())))\n"],
                      {"inputs": ["3 9\n", "-1 -5\n"], "outputs": ["9\n", "-1\n"]})]


def write_jsonl(path: pathlib.Path, rows: list, extra_lines: tuple[str, ...] = ()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row) for row in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_all(root: pathlib.Path, humaneval_gz: pathlib.Path) -> pathlib.Path:
    """``root/mbpp/mbpp.jsonl``, ``root/mbpp/sanitized-mbpp.json``, ``root/apps/{train,test}
    .jsonl`` (with a line that is not JSON) and ``root/humaneval/HumanEval.jsonl.gz``:
    `root` is then a benchmarks_dir for APPS."""
    write_jsonl(root / "mbpp" / "mbpp.jsonl", MBPP)
    (root / "mbpp" / "sanitized-mbpp.json").write_text(json.dumps(MBPP_SANITIZED, indent=1),
                                                       encoding="utf-8")
    prompt = json.loads(gzip.decompress(humaneval_gz.read_bytes()).splitlines()[0])["prompt"]
    # HumanEval/0's prompt with other spacing: contaminated.
    copied = apps_row(13, prompt.replace("\n", " \n  "), ["print(1)\n"],
                      {"inputs": [""], "outputs": ["1\n"]})
    write_jsonl(root / "apps" / "train.jsonl", [*APPS_TRAIN, copied],
                extra_lines=("{not json",))
    write_jsonl(root / "apps" / "test.jsonl", APPS_TEST)
    (root / "humaneval").mkdir(parents=True, exist_ok=True)
    (root / "humaneval" / "HumanEval.jsonl.gz").write_bytes(
        gzip.compress(gzip.decompress(humaneval_gz.read_bytes())))
    return root
