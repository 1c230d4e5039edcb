"""Reinforcement Pre-Training examples from a tiny local corpus."""

import re

import pytest

from grpo_jax import data
from grpo_jax.data import rpt

FOX = "The quick brown fox jumps over the lazy dog. It was not amused."

DOCUMENTS = [
    "Rivers carry sediment from the mountains to the sea. Over thousands of years the "
    "deposits build deltas, wide flat plains of fertile soil.",
    "A compiler translates source code into machine code. First it parses the text "
    "into a tree, then it checks types, and finally it emits instructions.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.\nMix the dry "
    "ingredients first, then add the egg and stir until smooth.",
    "Honey bees communicate with a waggle dance. The angle of the dance shows the "
    "direction of the flowers, and its length shows the distance.",
    "In chess, a pawn that reaches the last rank is promoted. Most players choose a "
    "queen, although a knight is sometimes the better piece.",
    "Glaciers move slowly downhill under their own weight. As they move, they grind "
    "the rock beneath them and leave long scratches behind.",
    "The library opens at nine on weekdays and at ten on Saturdays. It is closed on "
    "Sundays and on public holidays.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. It "
    "takes place in the chloroplasts of plant cells.",
]


def config(corpus, **kwargs):
    knobs = dict(corpus_dir=str(corpus), context_tokens=12, min_context_tokens=4,
                 stride=5, test_fraction=0.5)
    return data.RptConfig(**{**knobs, **kwargs})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(DOCUMENTS):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(exist_ok=True)
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    (root / "notes.md").write_text("not a .txt file, ignored")
    return root


class TestDocumentExamples:

    def test_windows_contexts_and_next_token(self):
        cfg = data.RptConfig(corpus_dir="unused", context_tokens=4, min_context_tokens=2,
                             continuation_tokens=1, stride=3)
        pairs = [(e["context"], e["continuation"]) for e in rpt.document_examples(FOX, cfg)]
        assert pairs == [
            ("The quick", "brown"),
            ("quick brown fox jumps", "over"),
            ("jumps over the lazy", "dog"),
            ("lazy dog. It", "was"),
            ("It was not amused", "."),
        ]

    def test_multi_token_continuation_keeps_the_raw_text(self):
        cfg = data.RptConfig(corpus_dir="unused", context_tokens=3, min_context_tokens=3,
                             continuation_tokens=3, stride=100)
        [example] = rpt.document_examples("a b c dog. Next\nline", cfg)
        assert example == {"task": "rpt", "question": "a b c", "answer": "dog. Next",
                           "solution": "\\boxed{dog. Next}", "context": "a b c",
                           "continuation": "dog. Next"}

    def test_line_breaks_survive_in_the_context(self):
        cfg = data.RptConfig(corpus_dir="unused", context_tokens=4, min_context_tokens=4,
                             stride=100)
        [example] = rpt.document_examples("one two\nthree four five", cfg)
        assert example["context"] == "one two\nthree four"
        assert example["continuation"] == "five"

    def test_document_shorter_than_the_minimum_context(self):
        cfg = data.RptConfig(corpus_dir="unused", min_context_tokens=8)
        assert list(rpt.document_examples("too short", cfg)) == []


class TestBuilder:

    def test_splits_partition_documents(self, tmp_path, corpus):
        cfg = config(corpus)
        splits = {split: [data.decode_example(r) for r in data.data_source(
            "rpt", split=split, data_dir=str(tmp_path), config=cfg)] for split in ("train", "test")}
        assert splits["train"] and splits["test"]
        expected = {split: [] for split in splits}
        for text in DOCUMENTS:
            expected[data.split_of(text, 0.5)] += list(rpt.document_examples(text, cfg))
        for split, examples in splits.items():
            key = lambda e: (e["context"], e["continuation"])
            assert sorted(map(key, examples)) == sorted(map(key, expected[split]))
        for example in splits["train"] + splits["test"]:
            assert example["question"] == example["context"]
            assert example["answer"] == example["continuation"]
            assert re.fullmatch(r"\w+|[^\w\s]", example["continuation"])
        train_text = " ".join(e["context"] for e in splits["train"])
        assert not any(e["context"] in train_text for e in splits["test"])

    def test_second_build_is_identical(self, tmp_path, corpus):
        read = lambda d: [data.decode_example(r) for r in data.data_source(
            "rpt", split="train", data_dir=str(d), config=config(corpus))]
        assert read(tmp_path / "a") == read(tmp_path / "b")

    def test_missing_corpus(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="rpt.corpus_dir=.* holds no .txt files"):
            data.data_source("rpt", split="train", data_dir=str(tmp_path / "out"),
                             config=config(tmp_path))

    @pytest.mark.parametrize("kwargs, message", [
        ({"corpus_dir": ""}, "rpt.corpus_dir must name a directory"),
        ({"stride": 0}, "rpt.stride must be >= 1, got 0"),
        ({"min_context_tokens": 20}, "rpt.min_context_tokens (20) must be <= rpt.context_tokens (12)"),
    ])
    def test_config_errors(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            config("corpus", **kwargs)
