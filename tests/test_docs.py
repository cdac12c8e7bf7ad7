"""The documentation site builds as ``make docs`` builds it, warnings as errors, holds all of README.rst, and runs.

README.rst is the short guide; each page of ``docs/guide`` includes the
README's section on its subject and goes on in its own text. The Python
blocks of those pages, and of every other page in ``docs/``, run as
README.rst's do (tests/test_readme.py): as written, or marked a fragment.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import (  # the same rules as README's blocks
    assert_every_fragment_says_so_in_the_text,
    assert_sybil_sees_every_python_block,
    python_blocks,
    run_block,
    torch_threads_kept,  # noqa: F401  (a fixture, used by name)
)

import parallelenv

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(page for page in DOCS.rglob("*.rst") if "_readme" not in page.parts)  # _readme: README's sections
BLOCKS = {page: python_blocks(page) for page in PAGES}
COMPLETE = [(page, block.example) for page, blocks in BLOCKS.items() for block in blocks if not block.fragment]


def load_readme_sections():
    spec = importlib.util.spec_from_file_location("readme_sections", DOCS / "readme_sections.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_the_site_builds_without_a_warning(tmp_path):
    out = tmp_path / "html"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    api = (out / "api" / "parallelenv.html").read_text()
    assert 'id="parallelenv.ParallelEnv.step"' in api, "autodoc documented no ParallelEnv.step"
    guide = (out / "guide" / "drop-in.html").read_text()
    assert "SB3VecEnv" in guide and "readme-choosing-para-mode" in (out / "guide" / "backends.html").read_text()
    assert "class ToyBackend" in re.sub(r"<[^>]+>", "", (out / "guide" / "writing-a-backend.html").read_text())
    assert (out / "_images" / "demo.png").is_file()
    assert (out / "_static" / "custom.css").is_file()
    pages = list(out.rglob("*.html"))
    without_version = [str(page.relative_to(out)) for page in pages
                       if "_modules" not in page.parts and f"Version {parallelenv.__version__}" not in page.read_text()]
    assert not without_version, f"pages that do not show the version: {without_version}"


def test_every_readme_section_is_on_a_page_of_the_guide():
    sections = load_readme_sections().readme_sections((ROOT / "README.rst").read_text())
    included = set()
    for page in PAGES:
        included.update(re.findall(r"^\.\. include:: .*_readme/([\w-]+)\.rst$", page.read_text(), re.M))
    missing = sorted(set(sections) - included)
    assert not missing, (
        f"README.rst's section(s) {missing} are on no page of the docs: add "
        "'.. include:: ../_readme/<name>.rst' to a page of docs/guide (and the page to a toctree of docs/index.rst)"
    )


def test_readme_references_to_its_own_headings_resolve_across_pages():
    module = load_readme_sections()
    text = "Intro\n=====\n\nSee `Backends`_ and `Gymnasium <https://gymnasium.farama.org>`_.\n\n" \
           "Backends\n--------\n\nTable.\n\nWriting a backend\n~~~~~~~~~~~~~~~~~\n\nA class.\n"
    sections = module.readme_sections(text)
    assert sections["intro"] == "See :ref:`Backends <readme-backends>` and `Gymnasium <https://gymnasium.farama.org>`_.\n"
    assert sections["backends"].startswith(".. _readme-backends:\n\nBackends\n--------\n")
    assert ".. _readme-writing-a-backend:\n\nWriting a backend\n~~~~" in sections["backends"]


def test_readme_links_to_pages_become_links_between_pages():
    """README links to a page by its path, which GitHub follows; on the site the link is a :doc: role."""
    text = ("Intro\n=====\n\nSee `Errors and\nfailures <docs/guide/errors.rst>`_ and `the contract <docs/design.rst>`_."
            "\n\nMore\n----\n\nText.\n")
    intro = load_readme_sections().readme_sections(text)["intro"]
    assert intro == "See :doc:`Errors and\nfailures </guide/errors>` and :doc:`the contract </design>`.\n"


def test_every_page_readme_links_to_exists():
    """A page renamed or gone would leave README's link pointing nowhere on GitHub (the site's build fails too)."""
    linked = {match.group(2) for match in load_readme_sections().DOCS_LINK.finditer((ROOT / "README.rst").read_text())}
    missing = sorted(page for page in linked if not (DOCS / f"{page}.rst").is_file())
    assert linked and not missing, f"README.rst links to docs pages that do not exist: {missing}"


def test_pages_link_each_other_rather_than_point_at_the_readme():
    for page in PAGES:
        said = re.findall(r"see (?:the )?README|README(?:\.rst)?'s \"|\(see README\)", page.read_text(), re.I)
        assert not said, f"{page.relative_to(ROOT)} sends readers to README: {said}; link the page instead (:doc:)"


def test_the_contract_sections_the_tests_cite_exist():
    """Tests cite docs/design.rst by section title: a renamed or dropped section must not leave them pointing nowhere."""
    lines = (DOCS / "design.rst").read_text().splitlines()
    titles = {title for title, underline in zip(lines, lines[1:], strict=False)
              if title.strip() and re.fullmatch(r"([=\-~^])\1{2,}", underline) and len(underline) >= len(title)}
    cited = set()
    for test_file in Path(__file__).parent.glob("test_*.py"):
        cited.update(re.findall(r'docs/design\.rst, "([^"]+)"', test_file.read_text()))
    assert cited, "no test cites a section of docs/design.rst"
    assert cited <= titles, f"cited sections not in docs/design.rst: {sorted(cited - titles)}"


def test_the_backend_page_shows_the_toy_backend_as_it_is():
    """"Writing a backend" shows tests/toy_backend.py, the backend the conformance suite runs, not a copy."""
    lines = (DOCS / "guide" / "writing-a-backend.rst").read_text().splitlines()
    start = lines.index(".. code-block:: python") + 2
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("   "))
    shown = "\n".join(line[3:] for line in lines[start:end]).strip()
    assert shown == (Path(__file__).parent / "toy_backend.py").read_text().strip()


# ------------------------------------------------------------------ the pages' code runs


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(DOCS)) for page in PAGES])
def test_sybil_sees_every_python_block_of_the_page(page):
    assert_sybil_sees_every_python_block(page, BLOCKS[page])


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(DOCS)) for page in PAGES])
def test_every_fragment_of_the_page_says_so_in_the_text(page):
    assert_every_fragment_says_so_in_the_text(page, BLOCKS[page])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page, example", COMPLETE,
                         ids=[f"{page.relative_to(DOCS)}:line{example.line}" for page, example in COMPLETE])
def test_complete_block_of_a_page_runs(page, example, request, no_leaks, torch_threads_kept):  # noqa: F811
    run_block(example, request)


def test_a_readme_link_to_the_page_that_includes_the_section_does_not_link_to_itself():
    """On the Backends page, the included section's link to the Backends page would lead nowhere new."""
    text = ("Intro\n=====\n\nText.\n\nBackends\n--------\n\nAsk `Backends <docs/guide/backends.rst>`_ "
            "and `Errors <docs/guide/errors.rst>`_.\n")
    module = load_readme_sections()
    section = module.readme_sections(text, {"backends": "guide/backends"})["backends"]
    assert section.endswith("Ask *Backends* (below) and :doc:`Errors </guide/errors>`.\n")
    assert module.including_pages(DOCS)["choosing-para-mode"] == "guide/backends"
