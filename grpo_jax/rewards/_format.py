"""Format: does the completion consist of the required tags, in order, and nothing else?"""

import functools
import re

from grpo_jax.rewards._registry import register

_TAG_NAME = re.compile(r"[A-Za-z][\w-]*")


@functools.lru_cache(maxsize=64)
def _layout(tags: tuple[str, ...]) -> re.Pattern:
    for tag in tags:
        if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
            raise ValueError(f"format reward option tags must be names like 'think', got {tag!r}")
    if not tags or len(set(tags)) != len(tags):
        raise ValueError(f"format reward option tags must be distinct and non-empty, got {tags!r}")
    blocks = r"\s*".join(f"<{tag}>.*?</{tag}>" for tag in tags)
    return re.compile(rf"\s*{blocks}\s*", re.DOTALL)


def has_format(text: str, tags: tuple[str, ...]) -> bool:
    """Whether `text` is `<tag>...</tag>` blocks for `tags`, in order, separated by whitespace only.

    Each tag opens and closes exactly once (so no tag hides inside another block);
    contents may be empty, as in DeepSeek-R1's format reward.

    Example:
      >>> has_format("<think>2+2</think> <answer>4</answer>", ("think", "answer"))
      True
    """
    tags = tuple(tags)
    layout = _layout(tags)
    if any(text.count(f"<{tag}>") != 1 or text.count(f"</{tag}>") != 1 for tag in tags):
        return False
    return layout.fullmatch(text) is not None


@register("format")
def format_reward(
    prompt: str, completion: str, example: dict, *, tags=("think", "answer")
) -> float:
    """1.0 if the completion has exactly the `tags` blocks in order (see `has_format`), else 0.0.

    When the prompt ends with the first opening tag (a template that pre-fills `<think>`),
    the completion is read as continuing it. Special tokens such as an end-of-sequence
    marker must be stripped before scoring, as the sampler's detokenisation does.

    Options:
      tags: tag names in their required order, e.g. `("think", "answer", "verify")`.
    """
    del example
    tags = tuple(tags)
    opener = f"<{tags[0]}>" if tags else ""
    if opener and prompt.rstrip().endswith(opener):
        completion = opener + completion
    return float(has_format(completion, tags))
