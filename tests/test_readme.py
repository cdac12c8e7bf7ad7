"""README.rst is a short guide, and every Python block of it runs as written, or says in the text that it is a fragment.

Sybil finds the blocks and runs each in a namespace of its own, as a
script's ``__main__``, so that a traceback points at the README's line. A
fragment is marked twice: the sentence before it says "fragment" for the
reader, and an ``.. skip: next`` comment, invisible once rendered, tells
Sybil. Blocks run in this process: the envs are cheap, and a block that
uses a Ray backend gets the session's Ray cluster instead of starting one.
tests/test_docs.py runs the blocks of the documentation's pages the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.evaluators.skip import Skipper
from sybil.parsers.rest import PythonCodeBlockParser, SkipParser

README = Path(__file__).resolve().parent.parent / "README.rst"
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
RAY_MODE = re.compile(r"""para_mode=["']ray""")


@dataclass(frozen=True)
class Block:
    example: Example
    fragment: bool


def python_blocks(path: Path) -> list[Block]:
    """The Python blocks of an rST file in order, each marked a fragment when a ``skip: next`` comment precedes it."""
    blocks: list[Block] = []
    skip_next = False
    for example in SYBIL.parse(path):
        if isinstance(example.region.evaluator, Skipper):
            action, condition = example.parsed
            if action != "next" or condition:
                raise ValueError(f"{path.name} line {example.line}: only '.. skip: next' marks a fragment here")
            skip_next = True
        else:
            blocks.append(Block(example, fragment=skip_next))
            skip_next = False
    return blocks


def assert_sybil_sees_every_python_block(path: Path, blocks: list[Block]) -> None:
    """A block Sybil's parser missed (a typo in the directive, odd indentation) would go untested."""
    assert len(blocks) == path.read_text().count(".. code-block:: python"), path


def assert_every_fragment_says_so_in_the_text(path: Path, blocks: list[Block]) -> None:
    text = path.read_text()
    for block in blocks:
        if block.fragment:
            paragraph_before = text[: block.example.start].rsplit(".. skip: next", 1)[0].rstrip().rsplit("\n\n", 1)[-1]
            assert "fragment" in paragraph_before, (
                f"{path.name} line {block.example.line}: the block is skipped as a fragment, "
                f"but the text before it does not say so: {paragraph_before!r}"
            )


def run_block(example: Example, request: pytest.FixtureRequest) -> None:
    """Run one complete block as the script a reader would save it as; a Ray block on the session's cluster."""
    if RAY_MODE.search(example.parsed):
        request.getfixturevalue("ray_session")
    example.namespace = {"__name__": "__main__"}
    example.evaluate()


BLOCKS = python_blocks(README)
COMPLETE = [block.example for block in BLOCKS if not block.fragment]


def test_sybil_sees_every_python_block():
    assert_sybil_sees_every_python_block(README, BLOCKS)


def test_every_fragment_says_so_in_the_text():
    assert_every_fragment_says_so_in_the_text(README, BLOCKS)


@pytest.fixture
def torch_threads_kept() -> Iterator[None]:
    """Blocks that train set torch's thread count for the process; the tests after them get theirs back."""
    try:
        import torch
    except ImportError:  # then no block changes it
        yield
        return
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("example", COMPLETE, ids=[f"line{example.line}" for example in COMPLETE])
def test_complete_block_runs(example, request, no_leaks, torch_threads_kept):
    run_block(example, request)


# ------------------------------------------------------------------ a guide, not a lab notebook

MAX_LINES = 400  # the guide aims at ~350; the rest of what users need is on the docs site's pages
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_the_readme_stays_a_short_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.rst has {len(lines)} lines, more than {MAX_LINES}: move the detail to a page of docs/guide "
        "and link it from README"
    )


def test_the_readme_quotes_no_commit():
    """A user has the package, not our history: a result says its date, machine and version instead."""
    found = COMMIT_HASH.findall(README.read_text())
    assert not found, f"README.rst names commits {found}"


def test_the_readme_opens_with_the_two_commands_and_names_make_docs():
    text = README.read_text()
    first_block = text.index(".. code-block::")
    first_section = re.search(r"^-{3,}$", text, re.M).start()
    assert first_block < first_section, "the two commands come before the first section"
    console = text[first_block:].split("\n\n", 2)[1]
    assert [line.split()[:2] for line in console.splitlines()] == [["make", "demo"], ["make", "test"]], console
    assert "``make docs``" in text


def test_the_readme_says_where_to_get_the_package():
    text = README.read_text()
    assert "not on PyPI" in text and "pip install -e ." in text
    assert 'pip install "parallelenv' not in text and "pip install parallelenv" not in text
