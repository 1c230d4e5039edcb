"""GSM8K and MATH-500 builders read the official files from a local manual_dir."""

import re
import shutil

import pytest

from grpo_jax import data
from grpo_jax.data import gsm8k


def read(name, split, data_dir, manual_dir):
    source = data.data_source(name, split=split, data_dir=str(data_dir),
                              manual_dir=str(manual_dir))
    return [data.decode_example(r) for r in source]


def by_answer(examples):
    return {e["answer"]: e for e in examples}


class TestGsm8k:

    def test_reads_both_official_files(self, data_dir, fixtures_dir):
        train = read("gsm8k", "train", data_dir, fixtures_dir / "gsm8k")
        test = read("gsm8k", "test", data_dir, fixtures_dir / "gsm8k")
        assert sorted(e["answer"] for e in train) == ["180", "27", "430", "6000"]
        assert sorted(e["answer"] for e in test) == ["108", "480", "68"]
        example = by_answer(train)["27"]
        assert example == {
            "task": "gsm8k",
            "question": "Mara buys 3 packs of pencils. Each pack has 12 pencils. She gives "
                        "9 pencils to her brother. How many pencils does Mara have left?",
            "answer": "27",
            "solution": "Mara buys 3 * 12 = 36 pencils.\n"
                        "After giving some away she has 36 - 9 = 27 pencils.\n#### 27",
        }

    def test_thousands_separator_removed_from_answer_and_final_line(self, data_dir,
                                                                    fixtures_dir):
        example = by_answer(read("gsm8k", "train", data_dir, fixtures_dir / "gsm8k"))["6000"]
        assert example["solution"].endswith("are left.\n#### 6000")
        assert "<<" not in example["solution"]

    def test_row_without_final_answer(self):
        with pytest.raises(ValueError, match="gsm8k: answer has no '#### <number>' line"):
            gsm8k.to_example({"question": "q", "answer": "It is 4."})

    def test_missing_file_names_the_file_and_the_fix(self, tmp_path):
        manual = tmp_path / "manual"
        manual.mkdir()
        (manual / "test.jsonl").write_text("")
        with pytest.raises(FileNotFoundError, match=r"train.jsonl not found; copy the official"):
            read("gsm8k", "train", tmp_path / "out", manual)

    def test_empty_manual_dir_shows_the_instructions(self, tmp_path):
        with pytest.raises(AssertionError, match="grade-school-math"):
            read("gsm8k", "train", tmp_path / "out", tmp_path / "absent")


GOOD_ROW = b'{"question": "What is 2+2?", "answer": "2+2=4\\n#### 4"}\n'
MALFORMED = [   # (the second line of train.jsonl, what the error says after "train.jsonl:2")
    (b'{"question": "q", "answer": "#### 4"', " is not JSON (Expecting"),
    (b'[1, 2]', " is a JSON list, not an object"),
    (b'{"question": 3, "answer": "#### 4"}', ": AttributeError: 'int' object has no attribute"),
    (b'{"question": "q", "answer": 4}', ": TypeError: argument of type 'int' is not"),
]


@pytest.mark.parametrize("line, said", MALFORMED,
                         ids=["torn", "list", "int-question", "int-answer"])
def test_a_malformed_row_names_its_file_and_line(tmp_path, line, said):
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "train.jsonl").write_bytes(GOOD_ROW + line + b"\n")
    (manual / "test.jsonl").write_bytes(GOOD_ROW)
    with pytest.raises(ValueError, match=re.escape(f"gsm8k: {manual / 'train.jsonl'}:2{said}")):
        read("gsm8k", "train", tmp_path / "out", manual)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "test.jsonl").write_bytes(GOOD_ROW + b'{"question": "\xff"}\n')
    message = f"math500: {manual / 'test.jsonl'} is not UTF-8"
    with pytest.raises(ValueError, match=re.escape(message)):
        read("math500", "test", tmp_path / "out", manual)


def test_other_or_edited_manual_files_build_anew(tmp_path, fixtures_dir):
    """The build under data_dir is keyed on the official files' contents: an edited file
    builds anew (the edit is read), the same contents elsewhere reuse the build."""
    manual = tmp_path / "manual"
    shutil.copytree(fixtures_dir / "gsm8k", manual)
    out = tmp_path / "out"
    answers = lambda directory: sorted(e["answer"] for e in read("gsm8k", "train", out,
                                                                  directory))
    assert answers(manual) == ["180", "27", "430", "6000"]
    train = manual / "train.jsonl"
    kept = [line for line in train.read_text().splitlines() if '"answer"' in line][:2]
    train.write_text("\n".join(kept) + "\n")
    edited = answers(manual)
    assert len(edited) == 2 and set(edited) < {"180", "27", "430", "6000"}
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(manual, elsewhere)
    assert answers(elsewhere) == edited
    assert len(list((out / "gsm8k").iterdir())) == 2   # the first build stays beside


class TestMath500:

    def test_reads_official_test_file(self, data_dir, fixtures_dir):
        test = read("math500", "test", data_dir, fixtures_dir / "math500")
        assert len(test) == 5
        example = by_answer(test)["\\frac{43}{12}"]
        assert example["task"] == "math500"
        assert example["question"].startswith("Compute $\\dfrac{5}{6} + \\dfrac{11}{4}$.")
        assert example["solution"].endswith("= \\boxed{\\frac{43}{12}}$.")
        assert (example["subject"], example["level"], example["unique_id"]) == (
            "Prealgebra", 2, "test/prealgebra/1377.json")
        polar = by_answer(test)["\\left( 4, \\frac{3 \\pi}{2} \\right)"]
        assert polar["level"] == 2 and polar["subject"] == "Precalculus"

    def test_has_only_a_test_split(self, data_dir, fixtures_dir):
        with pytest.raises(ValueError, match="train"):
            read("math500", "train", data_dir, fixtures_dir / "math500")

    def test_row_missing_a_field(self, tmp_path):
        manual = tmp_path / "manual"
        manual.mkdir()
        (manual / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
        with pytest.raises(
            ValueError, match=r"lacks \['level', 'solution', 'subject', 'unique_id'\]"
        ):
            read("math500", "test", tmp_path / "out", manual)
