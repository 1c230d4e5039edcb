"""Reinforcement Pre-Training examples from a tiny local corpus."""

import dataclasses
import re

import jax
import numpy as np
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
                           "continuation": "dog. Next", "proxy_entropy": -1.0}

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

    @pytest.mark.parametrize(
        "kwargs, message",
        [
            ({"corpus_dir": ""}, "rpt.corpus_dir must name a directory"),
            ({"stride": 0}, "rpt.stride must be >= 1, got 0"),
            (
                {"min_context_tokens": 20},
                "rpt.min_context_tokens (20) must be <= rpt.context_tokens (12)",
            ),
        ],
    )
    def test_config_errors(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            config("corpus", **kwargs)


class TestHardTokens:
    """Hard-token selection by a proxy model's top-k entropy (RPT sec. 3.3)."""

    @pytest.fixture(scope="class")
    def proxy(self, tmp_path_factory):
        """A tiny random model with a character tokenizer, saved as a HF checkpoint."""
        from grpo_jax import models
        from grpo_jax.training import tokenizer as tokenizer_lib
        tok = tokenizer_lib.train_char_tokenizer(DOCUMENTS + [FOX])
        cfg = models.get_model_config("tiny", vocab_size=128, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, bos_token_id=None)
        path = tmp_path_factory.mktemp("proxy")
        models.save_pretrained(models.init_model(cfg, seed=5), str(path), tokenizer=tok)
        return str(path)

    def test_top_k_entropy_by_hand(self):
        # top 2 of (0.5, 0.3, 0.2) renormalised: (5/8, 3/8).
        logits = np.log([0.5, 0.3, 0.2])
        expected = -(0.625 * np.log(0.625) + 0.375 * np.log(0.375))
        assert rpt.top_k_entropy(logits, 2) == pytest.approx(expected, rel=1e-12)
        assert rpt.top_k_entropy(logits, 3) == pytest.approx(
            -(np.log([0.5, 0.3, 0.2]) * [0.5, 0.3, 0.2]).sum()
        )

    def test_entropies_equal_a_forward_pass_per_prefix(self, proxy):
        from grpo_jax import models
        model, tok = models.from_pretrained(proxy)
        scorer = rpt.ProxyEntropy(proxy, top_k=16)
        offsets = [m.start() for m in re.finditer(r"\w+|[^\w\s]", FOX)][1:8]
        got = scorer(FOX, offsets)
        forward = jax.jit(lambda ids: model(ids))   # compiled per prefix length (eager: per op)
        for offset, entropy in zip(offsets, got):   # the prefix alone, run through the model
            ids = tok(FOX[:offset], add_special_tokens=False)["input_ids"]   # "The " -> "quick"
            logits = np.asarray(forward(np.asarray([ids], np.int32)))[0, -1]
            assert entropy == pytest.approx(rpt.top_k_entropy(logits, 16), rel=1e-5, abs=1e-6)

    def test_only_positions_at_or_above_the_threshold_are_kept(self, proxy):
        cfg = data.RptConfig(corpus_dir="unused", context_tokens=8, min_context_tokens=2, stride=1,
                             proxy_model=proxy)
        scorer = rpt.ProxyEntropy(proxy, top_k=16)
        every = list(rpt.document_examples(FOX, cfg, scorer))
        threshold = float(np.median([e["proxy_entropy"] for e in every]))
        hard = list(rpt.document_examples(FOX, dataclasses.replace(cfg, min_entropy=threshold),
                                          scorer))
        assert 0 < len(hard) < len(every)
        assert [e for e in every if e["proxy_entropy"] >= threshold] == hard

    def test_the_builtin_corpus_needs_no_files(self, tmp_path):
        source = data.data_source("rpt", split="train", data_dir=str(tmp_path),
                                  config=config("builtin:arithmetic", stride=7))
        example = data.decode_example(source[0])
        assert example["task"] == "rpt" and example["proxy_entropy"] == -1.0
        assert re.fullmatch(r"[\d+=#\s]+", example["context"] + example["continuation"])
        doc = rpt.builtin_documents("builtin:arithmetic", count=1)[0][1]
        for line in doc.splitlines():   # every line is a correct sum with its work
            question, _, work = line.partition("=")
            a, b = map(int, question.split("+"))
            assert work.endswith(f"#### {a + b}")
