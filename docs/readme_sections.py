"""README.rst cut at its sections into files that the user guide's pages include.

README.rst is the short guide, written once: a page of ``docs/guide``
includes the README's section on its subject, then goes on in its own text.
README links to those pages by their paths in the repository
(```Backends <docs/guide/backends.rst>`_``), which GitHub follows; on the
site the links become ``:doc:`` roles.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path

TITLE_LEVELS = "=-~"  # README.rst's title, its sections, their subsections
LABEL = ".. _readme-"
DOCS_LINK = re.compile(r"`([^`<>]+?)\s*<docs/([\w/-]+)\.rst>`_(?!_)")  # `Title <docs/guide/page.rst>`_
INCLUDE = re.compile(r"^\.\. include:: .*_readme/([\w-]+)\.rst$", re.M)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.replace("``", "").lower()).strip("-")


def headings(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, title) of every heading: a line over a rule of one of TITLE_LEVELS, at least as long."""
    found = []
    for i, (title, rule) in enumerate(pairwise(lines)):
        if (title.strip() and rule and len(set(rule)) == 1 and rule[0] in TITLE_LEVELS
                and len(rule) >= len(title.rstrip()) and (i == 0 or not lines[i - 1].strip())):
            found.append((i, title.rstrip()))
    return found


def readme_sections(text: str, pages: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{slug: text}`` of each section of README.rst, and the part before the first as ``intro``.

    Each heading gets the label ``readme-<slug>``, and README's references to
    its own headings (```Backends`_``) become ``:ref:`` roles: once the
    sections are on different pages, a plain reference to a title on another
    page would not resolve. Its links to pages of ``docs`` become ``:doc:`` roles,
    except a link to the page that includes the section (``pages``: slug ->
    that page, as ``guide/backends``), which would lead the reader to where
    they already are: it becomes the title, "below", where that page goes on.
    """
    lines = text.splitlines()
    marks = headings(lines)
    titles = {title: slug(title) for _, title in marks}

    def cross_page(match: re.Match[str]) -> str:
        title = match.group(1)
        return f":ref:`{title} <readme-{titles[title]}>`" if title in titles else match.group(0)

    for i, title in reversed(marks):
        lines[i:i] = [f"{LABEL}{slug(title)}:", ""]
    lines = re.sub(r"`([^`<>]+)`_(?!_)", cross_page, "\n".join(lines)).splitlines()
    # A label, a blank line, the title, its rule: a section starts where its rule is "-".
    starts = [i for i, line in enumerate(lines) if line.startswith(LABEL) and lines[i + 3][:1] == "-"]
    sections = {"intro": "\n".join(lines[4:starts[0]]).strip() + "\n"}  # after README's own title
    for begin, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        sections[slug(lines[begin + 2])] = "\n".join(lines[begin:end]).strip() + "\n"
    return {name: page_links(section, (pages or {}).get(name)) for name, section in sections.items()}


def page_links(text: str, own_page: str | None) -> str:
    """README's links to pages of ``docs`` as ``:doc:`` roles; one to ``own_page`` as its title, below."""
    def link(match: re.Match[str]) -> str:
        title, page = match.groups()
        if page == own_page:
            return f"*{title}* (below)"
        return f":doc:`{title} </{page}>`"  # a page that is not there fails the build (-W)

    return DOCS_LINK.sub(link, text)


def including_pages(docs: Path) -> dict[str, str]:
    """``{section slug: page}`` of every page of ``docs`` that includes a README section, as ``guide/backends``."""
    pages = {}
    for page in sorted(docs.rglob("*.rst")):
        if "_readme" not in page.parts:
            for name in INCLUDE.findall(page.read_text()):
                pages[name] = page.relative_to(docs).with_suffix("").as_posix()
    return pages


def write_sections(readme: Path, out: Path) -> dict[str, str]:
    """Write ``out/<slug>.rst`` for each section; returns the sections."""
    out.mkdir(exist_ok=True)
    sections = readme_sections(readme.read_text(), including_pages(out.parent))
    for stale in set(out.glob("*.rst")) - {out / f"{name}.rst" for name in sections}:
        stale.unlink()  # a section renamed or gone: the page that includes it must fail, not show old text
    for name, text in sections.items():
        path = out / f"{name}.rst"
        if not path.exists() or path.read_text() != text:  # untouched files keep their dates for Sphinx
            path.write_text(text)
    return sections
