"""The documentation site builds as ``make docs`` builds it, warnings as errors, and holds all of README.rst."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


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
    assert "SB3VecEnv" in guide and "readme-backends" in (out / "guide" / "getting-started.html").read_text()
    assert (out / "_images" / "demo.png").is_file()


def test_every_readme_section_is_on_a_page_of_the_guide():
    sections = load_readme_sections().readme_sections((ROOT / "README.rst").read_text())
    included = set()
    for page in DOCS.rglob("*.rst"):
        if "_readme" not in page.parts:
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
