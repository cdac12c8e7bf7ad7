"""Sphinx configuration: the user guide (README.rst's sections and the pages of docs/guide), the API reference autodoc.

``make docs`` builds the site into build/docs with warnings as errors;
tests/test_docs.py builds it the same way in ``make test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The package of this checkout, not whichever parallelenv the Python running Sphinx has installed.
sys.path[:0] = [str(ROOT), str(DOCS)]

from readme_sections import write_sections  # noqa: E402
from sphinx.ext.autodoc.mock import MockFinder  # noqa: E402

import parallelenv  # noqa: E402

project = "parallelenv"
author = "the parallelenv authors"
copyright = "2026, the parallelenv authors"
release = version = parallelenv.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
html_theme = "alabaster"  # Sphinx's own: no theme package to install
html_static_path = ["_static"]
html_theme_options = {
    "description": f"Gymnasium envs in parallel behind one object. Version {release}.",  # in every page's sidebar
    "fixed_sidebar": False,  # a fixed sidebar taller than the window gets a scrollbar of its own
    "page_width": "1240px",  # fits a 1280 px window; _static/custom.css wraps what is still too long
    "body_max_width": "none",  # the basic theme's 800px would leave the body narrower than the page
}
html_title = f"parallelenv {release}"
exclude_patterns = ["_build", "_readme"]  # _readme holds include files, not pages

autodoc_member_order = "bysource"
autodoc_typehints = "description"  # signatures stay readable; the types go beside each argument
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# torch, SB3 and Tianshou cost seconds to import, and mocked they change no page (the package's annotations
# are strings), so the build needs none. Mocked for the whole build, not only while autodoc imports a
# module (autodoc_mock_imports): Sphinx imports the real SB3, and torch with it, to read the source
# of the classes SB3VecEnv derives from.
sys.meta_path.insert(0, MockFinder(["stable_baselines3", "tianshou", "torch"]))

write_sections(ROOT / "README.rst", DOCS / "_readme")
