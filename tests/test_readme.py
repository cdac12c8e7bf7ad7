"""Every Python block of README.rst runs as written, or says in the text that it is a fragment.

Sybil finds the blocks and runs each in a namespace of its own, as a
script's ``__main__``, so that a traceback points at the README's line. A
fragment is marked twice: the sentence before it says "fragment" for the
reader, and an ``.. skip: next`` comment, invisible once rendered, tells
Sybil. Blocks run in this process: the envs are cheap, and a block that
uses a Ray backend gets the session's Ray cluster instead of starting one.
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


def readme_blocks() -> list[Block]:
    """README.rst's Python blocks in order, each marked a fragment when a ``skip: next`` comment precedes it."""
    blocks: list[Block] = []
    skip_next = False
    for example in SYBIL.parse(README):
        if isinstance(example.region.evaluator, Skipper):
            action, condition = example.parsed
            if action != "next" or condition:
                raise ValueError(f"README.rst line {example.line}: only '.. skip: next' marks a fragment here")
            skip_next = True
        else:
            blocks.append(Block(example, fragment=skip_next))
            skip_next = False
    return blocks


BLOCKS = readme_blocks()
COMPLETE = [block.example for block in BLOCKS if not block.fragment]


def test_sybil_sees_every_python_block():
    """A block Sybil's parser missed (a typo in the directive, odd indentation) would go untested."""
    assert len(BLOCKS) == README.read_text().count(".. code-block:: python")


def test_every_fragment_says_so_in_the_text():
    text = README.read_text()
    for block in BLOCKS:
        if block.fragment:
            paragraph_before = text[: block.example.start].rsplit(".. skip: next", 1)[0].rstrip().rsplit("\n\n", 1)[-1]
            assert "fragment" in paragraph_before, (
                f"README.rst line {block.example.line}: the block is skipped as a fragment, "
                f"but the text before it does not say so: {paragraph_before!r}"
            )


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
    if RAY_MODE.search(example.parsed):
        request.getfixturevalue("ray_session")
    example.namespace = {"__name__": "__main__"}  # as the script a reader would save it as
    example.evaluate()
