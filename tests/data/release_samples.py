"""A few rows of each math data set in its published file format (field names, nesting
and types as released; see grpo_jax.data.benchmarks and grpo_jax.data.math_train),
written as ``<root>/<name>/<file>``: the layout of a ``benchmarks_dir``.

Some training rows repeat a benchmark's problem with other spacing or punctuation (to be
found by decontamination) or repeat each other (to be deduplicated).
"""

import io
import json
import pathlib
import shutil
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
AIME_URL = "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_{}"
AMC_URL = "https://artofproblemsolving.com/wiki/index.php/{}_AMC_12A_Problems/Problem_{}"
HUB_PARQUET = "train-00000-of-00001.parquet"
DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\n{}\n\nRemember to put your answer on its own line after \"Answer:\".")

AIME24 = [
    {"id": 60, "problem": "Find the number of positive divisors of $2024$ that are odd.",
     "solution": "Since $2024 = 2^3 \\cdot 11 \\cdot 23$, the odd divisors number "
                 "$2 \\cdot 2 = 4$.",
     "answer": "004", "url": AIME_URL.format(1), "year": "2024"},
    {"id": 61, "problem": "Let $x$ be the least positive integer with $x \\equiv 33 \\pmod{100}$"
                          " and $x > 900$. Find $x \\bmod 1000$.",
     "solution": "The least such $x$ is $\\boxed{933}$.", "answer": "933",
     "url": AIME_URL.format(2), "year": "2024"},
]
AIME25 = [
    {"problem_idx": 1, "problem": "Find the sum of all integer bases $b>9$ for which $17_b$ "
                                  "is a divisor of $97_b$.", "answer": 70},
    {"problem_idx": 2, "problem": "How many ordered pairs $(x, y)$ of integers in "
                                  "$[-100, 100]$ satisfy $12x^2 - xy - 6y^2 = 0$?",
     "answer": 117},
]
AMC = [
    {"id": 0, "problem": "What is the value of $\\frac{2^2 + 2^2}{2}$?", "answer": 4.0,
     "url": AMC_URL.format(2023, 1)},
    {"id": 1, "problem": "A square has area $2.25$. What is its side length?", "answer": 1.5,
     "url": AMC_URL.format(2023, 2)},
    {"id": 2, "problem": "How many primes are less than $10$?", "answer": 4.0,
     "url": AMC_URL.format(2022, 3)},
]
MINERVA = [
    {"question": "Preamble: A star has a parallax of $0.1$ arcseconds.\n\nWhat is its "
                 "distance in parsecs?", "answer": "10"},
    {"question": "Compute the wavelength, in nm, of a photon of energy $2.48$ eV.",
     "answer": "500"},
]
OLYMPIAD = [
    {"id": 1606, "subfield": "Algebra", "context": None,
     "question": "Find all real $x$ such that $x^2 = \\frac{1}{4}$.",
     "solution": ["Taking square roots gives $x = \\pm \\frac{1}{2}$."],
     "final_answer": ["$\\frac{1}{2}$", "$-\\frac{1}{2}$"], "is_multiple_answer": True,
     "unit": None, "answer_type": "Numerical", "error": None},
    {"id": 2499, "subfield": "Combinatorics",
     "context": "A frog jumps on the integers, starting at $0$.",
     "question": "Each jump moves it $1$ or $2$ to the right. In how many ways can it "
                 "reach $4$?",
     "solution": ["The counts follow the Fibonacci numbers: $1, 2, 3, 5$."],
     "final_answer": ["$5$"], "is_multiple_answer": False, "unit": None,
     "answer_type": "Numerical", "error": None},
]

# Training sets. DAPO repeats each problem; one repeats AIME 2024's first problem.
DAPO_PROBLEMS = [
    ("In triangle $ABC$, $AB = 3$ and $BC = 4$ with a right angle at $B$. Find $AC^2$.", "25"),
    ("Find the number of positive divisors of 2024 that are odd.", "4"),
    ("What is the largest prime factor of $91$?", "13"),
]
DAPO_REPEATS = 3
MATH_ROWS = {   # MATH.tar member -> row; the test one is a MATH-500 problem
    "MATH/train/algebra/1.json": {
        "problem": "If $2x + 3 = 11$, what is $x$?", "level": "Level 1", "type": "Algebra",
        "solution": "Subtracting 3 gives $2x = 8$, so $x = \\boxed{4}$."},
    "MATH/train/algebra/25.json": {
        "problem": "If $3x - 7 = 2x + 5$, what is the value of $x^2$?", "level": "Level 1",
        "type": "Algebra", "solution": "We get $x = 12$, so $x^2 = \\boxed{144}$."},
    "MATH/train/geometry/3.json": {
        "problem": "A circle has radius $3$. What is its area?", "level": "Level ?",
        "type": "Geometry", "solution": "The area is $\\pi r^2 = \\fbox{9\\pi}$."},
    "MATH/test/number_theory/645.json": {
        "problem": "What is the remainder when $2^{100}$ is divided by $7$?",
        "level": "Level 3", "type": "Number Theory",
        "solution": "Since $2^3 \\equiv 1$, $2^{100} \\equiv 2$. The remainder is $\\boxed{2}$."},
}
DEEPSCALER = [
    {"problem": "What is the value of $\\frac{2^2+2^2}{2}$ ?", "answer": "4",
     "solution": "It is $8/2 = \\boxed{4}$."},
    {"problem": "Compute $1 + 2 + \\cdots + 10$.", "answer": "55",
     "solution": "The sum is $\\frac{10 \\cdot 11}{2} = 55$."},
    {"problem": "Compute $1+2+\\cdots+10$.", "answer": "55", "solution": ""},
    {"problem": "Find the area of a unit square.", "answer": "", "solution": ""},
]


def write_parquet(path: pathlib.Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_json(path: pathlib.Path, value, *, lines: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in value) if lines else json.dumps(value)
    path.write_text(text, encoding="utf-8")


def dapo_rows() -> list[dict]:
    rows = []
    for repeat in range(DAPO_REPEATS):
        for index, (problem, answer) in enumerate(DAPO_PROBLEMS):
            rows.append({
                "data_source": "math_dapo",
                "prompt": [{"content": DAPO_PROMPT.format(problem), "role": "user"}],
                "ability": "MATH",
                "reward_model": {"ground_truth": answer, "style": "rule-lean"},
                "extra_info": {"index": f"9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74{index:03d}"}})
    return rows


def write_math_tar(path: pathlib.Path, rows: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, row in rows.items():
            blob = json.dumps(row).encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def write_all(root: pathlib.Path) -> pathlib.Path:
    """Every sample file under `root` (``root/<name>/<file>``); returns `root`."""
    write_parquet(root / "aime24" / HUB_PARQUET, AIME24)
    write_parquet(root / "aime25" / HUB_PARQUET, AIME25)
    write_parquet(root / "amc23" / HUB_PARQUET, AMC)
    write_json(root / "minerva_math" / "test.jsonl", MINERVA, lines=True)
    write_json(root / "olympiadbench" / "OE_TO_maths_en_COMP.json", OLYMPIAD)
    (root / "math500").mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "math500" / "test.jsonl", root / "math500" / "test.jsonl")
    write_parquet(root / "dapo_math_17k" / "dapo-math-17k.parquet", dapo_rows())
    write_math_tar(root / "math" / "MATH.tar", MATH_ROWS)
    write_json(root / "deepscaler" / "deepscaler.json", DEEPSCALER)
    return root
