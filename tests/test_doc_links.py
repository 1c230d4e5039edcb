"""Every relative link of the README and docs/ leads somewhere: the file exists, and a
`#anchor` names a heading of the page it points at (GitHub's heading ids)."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         REPO / "experiments" / "ablations" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a `# comment` there is not a heading)."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's id of a heading: its text lower-cased, markup and punctuation dropped
    (hyphens and underscores kept), spaces made hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """The ids of `page`'s headings, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    ids = set()
    for line in prose(page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = anchor(match.group(1))
            count = seen.get(base, 0)
            ids.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return ids


def test_anchor_is_githubs_id():
    assert anchor("Measured on CPU: one mesh and split meshes, 2 cores") == (
        "measured-on-cpu-one-mesh-and-split-meshes-2-cores")
    assert anchor("The critic (PPO, VAPO)") == "the-critic-ppo-vapo"
    assert anchor("Off-policy corrections (DeepSeek-V3.2)") == "off-policy-corrections-deepseek-v32"
    assert anchor("`rollout.slots`: continuous batching") == "rolloutslots-continuous-batching"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"title", "two-words"}
    assert broken(page, "[a](page.md#two-words) [b](page.md#not-a-heading) [c](none.md)") == [
        "page.md#not-a-heading", "none.md"]


def broken(page: pathlib.Path, text: str) -> list[str]:
    """The relative links of `text` (read as if it were `page`'s) that lead nowhere."""
    bad = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):                  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            bad.append(target)
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_lead_somewhere(page):
    assert broken(page, page.read_text()) == []
