"""Reinforcement Pre-Training (RPT, Dong et al. 2025, arXiv:2506.08007) from a local corpus.

RPT turns next-token prediction into a verifiable reasoning task: the prompt is a
context from a text corpus, the model reasons and then states the text it predicts
comes next, and the reward is whether that prediction matches the true
continuation. This module is the data side; ``grpo_jax.rewards`` grades it.

Tokens here are words and single punctuation marks (regex ``\\w+|[^\\w\\s]``), so
the data does not depend on a model's tokenizer. Each ``.txt`` file under
``corpus_dir`` (recursively) is a document; a document yields one example every
``stride`` tokens, once at least ``min_context_tokens`` tokens precede it:

* ``context``: the raw text of up to ``context_tokens`` tokens before the position
  (line breaks kept, trailing whitespace removed);
* ``continuation``: the raw text of the next ``continuation_tokens`` tokens.

``question`` is the context and ``answer`` the continuation; ``solution`` is
``\\boxed{<continuation>}``. Whole documents go to ``train`` or ``test`` by a hash of
their text, so no context is shared between the splits.

Hard tokens (RPT sec. 3.3): with ``proxy_model`` (a local Hugging Face checkpoint, the
paper uses DeepSeek-R1-Distill-Qwen-1.5B), each position's next-token entropy under the
proxy, over its ``entropy_top_k`` most likely tokens (16 in the paper) renormalised, is
computed from one forward pass per document, and positions below ``min_entropy`` are
dropped: the easy tokens a model predicts without reasoning. Each example keeps its
``proxy_entropy`` (-1 when no proxy was used).

``corpus_dir="builtin:arithmetic"`` is a corpus that needs no files: documents of
3-digit additions written out with their column-by-column work (the arithmetic task's
solutions), so the tiny CPU models have a corpus whose next tokens take computing.
"""

import dataclasses
import functools
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
from etils import epath
import tensorflow_datasets as tfds

from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import arithmetic
from grpo_jax.data import prompts

TOKEN = re.compile(r"\w+|[^\w\s]")
BUILTIN_ARITHMETIC = "builtin:arithmetic"


@dataclasses.dataclass(eq=False)
class RptConfig(_procedural.KnobConfig):
    """Where the corpus is and how it is cut into examples.

    Attributes:
      corpus_dir: a directory of ``.txt`` files (searched recursively).
      context_tokens: most tokens of context before the predicted position.
      min_context_tokens: fewest tokens of context (the first position of a document).
      continuation_tokens: tokens in the true continuation.
      stride: tokens between consecutive predicted positions in a document.
      proxy_model: a local HF checkpoint whose next-token entropy selects hard positions
        ("" keeps every position).
      entropy_top_k: the proxy's most likely tokens the entropy is taken over.
      min_entropy: positions whose proxy entropy (nats) is below this are dropped.
    """

    PREFIX: ClassVar[str] = "rpt"

    corpus_dir: str = ""
    context_tokens: int = 64
    min_context_tokens: int = 8
    continuation_tokens: int = 1
    stride: int = 16
    proxy_model: str = ""
    entropy_top_k: int = 16
    min_entropy: float = 0.0

    def __post_init__(self):
        self.corpus_dir = str(self.corpus_dir)
        if not self.corpus_dir:
            raise ValueError("rpt.corpus_dir must name a directory of .txt files (or be "
                             f"{BUILTIN_ARITHMETIC!r})")
        if self.entropy_top_k < 2:
            raise ValueError(f"rpt.entropy_top_k must be >= 2, got {self.entropy_top_k}")
        for field in ("context_tokens", "min_context_tokens", "continuation_tokens", "stride"):
            if getattr(self, field) < 1:
                raise ValueError(f"rpt.{field} must be >= 1, got {getattr(self, field)}")
        if self.min_context_tokens > self.context_tokens:
            raise ValueError(
                f"rpt.min_context_tokens ({self.min_context_tokens}) must be <= "
                f"rpt.context_tokens ({self.context_tokens})")
        super().__post_init__()


def document_examples(text: str, config: RptConfig, entropy=None) -> Iterator[dict[str, Any]]:
    """The RPT examples of one document, in order of position.

    Args:
      text: the document.
      config: the cutting knobs.
      entropy: None, or a function `(text, char_offsets) -> [n] proxy entropies` of the
        positions; positions below ``config.min_entropy`` are dropped.
    """
    spans = [m.span() for m in TOKEN.finditer(text)]
    last = len(spans) - config.continuation_tokens
    positions = list(range(config.min_context_tokens, last + 1, config.stride))
    scores = (np.full(len(positions), -1.0) if entropy is None
              else entropy(text, [spans[i][0] for i in positions]))
    for i, score in zip(positions, scores):
        if entropy is not None and score < config.min_entropy:
            continue
        start = spans[max(0, i - config.context_tokens)][0]
        context = text[start:spans[i][0]].rstrip()
        continuation = text[spans[i][0]:spans[i + config.continuation_tokens - 1][1]]
        yield {"task": "rpt", "question": context, "answer": continuation,
               "solution": prompts.render_answer("rpt", continuation),
               "context": context, "continuation": continuation,
               "proxy_entropy": float(score)}


def top_k_entropy(logits_v, k):
    """Entropy (nats) of the softmax over the `k` largest of `[V]` logits, renormalised.

    >>> round(float(top_k_entropy(np.log(np.array([0.5, 0.25, 0.25, 1e-9])), 2)), 4)
    0.6365
    """
    top = np.sort(np.asarray(logits_v, np.float64))[-k:]
    p = np.exp(top - top.max())
    p /= p.sum()
    return float(-(p * np.log(p)).sum())


def predicting_positions(token_offsets, char_offsets):
    """For each char offset, the index of the token whose logits predict the text there:
    the token before the first token that ends after the offset (-1: the document's start).

    >>> predicting_positions([(0, 3), (3, 4), (4, 9)], [3, 4, 6])
    [0, 1, 1]
    """
    ends = [end for _, end in token_offsets]
    return [int(np.searchsorted(ends, c, side="right")) - 1 for c in char_offsets]


class ProxyEntropy:
    """Next-token entropies of a proxy model at character offsets of a document."""

    def __init__(self, path, top_k, window=1024):
        import jax   # the data package does not need JAX otherwise
        from grpo_jax import models
        model, self.tokenizer = models.from_pretrained(path)
        if self.tokenizer is None:
            raise FileNotFoundError(f"rpt.proxy_model {path!r} has no tokenizer files")
        self.top_k, self.window = top_k, window
        self._logits = jax.jit(lambda tokens: model(tokens))

    def __call__(self, text, char_offsets):
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        rows = []
        for start in range(0, max(len(ids), 1), self.window):   # one forward per window
            chunk = ids[start:start + self.window]
            padded = np.zeros((1, self.window), np.int32)
            padded[0, :len(chunk)] = chunk
            rows.append(np.asarray(self._logits(padded))[0, :len(chunk)])
        logits = np.concatenate(rows) if rows else np.zeros((0, 1))
        out = []
        for position in predicting_positions(offsets, char_offsets):
            # The first token of the document has no left context: nothing to predict from.
            out.append(top_k_entropy(logits[position], self.top_k) if position >= 0 else 0.0)
        return np.asarray(out)


@functools.lru_cache(maxsize=4)
def _proxy(path, top_k):
    return ProxyEntropy(path, top_k)


def builtin_documents(name: str, count: int = 400, lines: int = 12) -> list[tuple[str, str]]:
    """`(document id, text)` of a corpus that needs no files (``builtin:arithmetic``)."""
    if name != BUILTIN_ARITHMETIC:
        raise ValueError(f"rpt.corpus_dir={name!r}: the builtin corpus is {BUILTIN_ARITHMETIC!r}")
    docs = []
    stream = arithmetic.generate(arithmetic.ArithmeticConfig(digits=3, name="rpt_corpus"))
    for doc in range(count):
        rows = [next(stream) for _ in range(lines)]
        docs.append((f"arithmetic_{doc:04d}",
                     "\n".join(f"{row['question']}={row['solution']}" for row in rows) + "\n"))
    return docs


def corpus_files(corpus_dir: str) -> list[epath.Path]:
    """The ``.txt`` files under ``corpus_dir``, sorted by path."""
    root = epath.Path(corpus_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"rpt.corpus_dir={corpus_dir!r} is not a directory")
    files = sorted(folder / name for folder, _, names in root.walk()
                   for name in names if name.endswith(".txt"))
    if not files:
        raise FileNotFoundError(f"rpt.corpus_dir={corpus_dir!r} holds no .txt files")
    return files


class Rpt(tfds.core.GeneratorBasedBuilder):
    """Next-token(s) prediction with reasoning from a local corpus (see ``grpo_jax.data.rpt``)."""

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {
        "1.0.0": "First release.",
        "1.1.0": "proxy_entropy; hard positions selected by a proxy model; builtin corpus.",
    }

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text
        return _procedural.info(
            self, _records.example_features(context=text(), continuation=text(),
                                            proxy_entropy=np.float32))

    def _split_generators(self, dl_manager):
        del dl_manager  # The corpus is local: config.corpus_dir.
        return {split: self._generate_examples(split) for split in _records.SPLITS}

    def _generate_examples(self, split: str):
        config = self.builder_config
        entropy = _proxy(config.proxy_model, config.entropy_top_k) if config.proxy_model else None
        for name, text in self._documents():
            if _records.split_of(text, config.test_fraction) != split:
                continue
            for index, example in enumerate(document_examples(text, config, entropy)):
                yield f"{name}:{index}", example

    def _documents(self):
        config = self.builder_config
        if config.corpus_dir.startswith("builtin:"):
            yield from builtin_documents(config.corpus_dir)
            return
        root = epath.Path(config.corpus_dir)
        for path in corpus_files(config.corpus_dir):
            yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
