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
"""

import dataclasses
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from etils import epath
import tensorflow_datasets as tfds

from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import prompts

TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclasses.dataclass(eq=False)
class RptConfig(_procedural.KnobConfig):
    """Where the corpus is and how it is cut into examples.

    Attributes:
      corpus_dir: a directory of ``.txt`` files (searched recursively).
      context_tokens: most tokens of context before the predicted position.
      min_context_tokens: fewest tokens of context (the first position of a document).
      continuation_tokens: tokens in the true continuation.
      stride: tokens between consecutive predicted positions in a document.
    """

    PREFIX: ClassVar[str] = "rpt"

    corpus_dir: str = ""
    context_tokens: int = 64
    min_context_tokens: int = 8
    continuation_tokens: int = 1
    stride: int = 16

    def __post_init__(self):
        self.corpus_dir = str(self.corpus_dir)
        if not self.corpus_dir:
            raise ValueError("rpt.corpus_dir must name a directory of .txt files")
        for field in ("context_tokens", "min_context_tokens", "continuation_tokens", "stride"):
            if getattr(self, field) < 1:
                raise ValueError(f"rpt.{field} must be >= 1, got {getattr(self, field)}")
        if self.min_context_tokens > self.context_tokens:
            raise ValueError(
                f"rpt.min_context_tokens ({self.min_context_tokens}) must be <= "
                f"rpt.context_tokens ({self.context_tokens})")
        super().__post_init__()


def document_examples(text: str, config: RptConfig) -> Iterator[dict[str, Any]]:
    """The RPT examples of one document, in order of position."""
    spans = [m.span() for m in TOKEN.finditer(text)]
    last = len(spans) - config.continuation_tokens
    for i in range(config.min_context_tokens, last + 1, config.stride):
        start = spans[max(0, i - config.context_tokens)][0]
        context = text[start:spans[i][0]].rstrip()
        continuation = text[spans[i][0]:spans[i + config.continuation_tokens - 1][1]]
        yield {"task": "rpt", "question": context, "answer": continuation,
               "solution": prompts.render_answer("rpt", continuation),
               "context": context, "continuation": continuation}


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

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text
        return _procedural.info(
            self, _records.example_features(context=text(), continuation=text()))

    def _split_generators(self, dl_manager):
        del dl_manager  # The corpus is local: config.corpus_dir.
        return {split: self._generate_examples(split) for split in _records.SPLITS}

    def _generate_examples(self, split: str):
        config = self.builder_config
        root = epath.Path(config.corpus_dir)
        for path in corpus_files(config.corpus_dir):
            text = path.read_text(encoding="utf-8")
            if _records.split_of(text, config.test_fraction) != split:
                continue
            for index, example in enumerate(document_examples(text, config)):
                yield f"{path.relative_to(root)}:{index}", example
