"""A framework test module skips, never errors, where its framework is only partly installed.

An environment where ``ray.rllib`` imports but ``ray.tune`` raises for lack
of pyarrow stopped the whole suite's collection. Here one module the
framework imports raises ImportError, as a missing dependency of it would,
and the test module's collection must end in a skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Each framework test module, and a module of its framework that it imports.
PARTLY_INSTALLED = {
    "test_rllib.py": "ray.tune",
    "test_tianshou.py": "tianshou.data",
    "test_torchrl.py": "torchrl.collectors",
    "test_sb3_view.py": "stable_baselines3.common.vec_env",
}
COLLECT = """
import sys
import pytest

class Broken:
    '''Importing {hidden} (or a module under it) fails as a missing dependency of it would.'''
    def find_spec(self, name, path=None, target=None):
        if name == {hidden!r} or name.startswith({hidden!r} + "."):
            raise ImportError(f"{{name}} cannot import a dependency (simulated)")
        return None

sys.meta_path.insert(0, Broken())
sys.exit(pytest.main(["--collect-only", "-q", "-rs", "-p", "no:cacheprovider", {module!r}]))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("module", PARTLY_INSTALLED)
def test_a_framework_test_module_skips_where_its_framework_imports_only_in_part(module):
    script = COLLECT.format(hidden=PARTLY_INSTALLED[module], module=str(TESTS / module))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=170, cwd=TESTS.parent)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, output[-3000:]
    assert "SKIPPED" in output and "error" not in output.lower(), output[-3000:]
