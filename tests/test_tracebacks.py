"""An env's error shows the user's own file and line, on every backend.

cloudpickle sends what the user's script defines by value, and since its
3.1.2 release its development branch (cloudpipe/cloudpickle#560, for 3.2)
names that code ``<dynamic-code>``: a traceback from a worker then says
``File "<dynamic-code>", line 16, in step`` and shows no source. The script
below is run as users run theirs (``python script.py``), under a cloudpickle
with that change in every process it starts (workers, Ray actors and their
workers): the pinned 3.1.2 predates it, and setup.cfg allows what follows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import RAY_BACKENDS

# cloudpipe/cloudpickle#560 as merged: each code object travels named "<dynamic-code>".
DYNAMIC_CODE = """
import types

import cloudpickle

_reduce_code = cloudpickle.Pickler.dispatch_table[types.CodeType]
cloudpickle.Pickler.dispatch_table[types.CodeType] = lambda code: _reduce_code(
    code.replace(co_filename="<dynamic-code>"))
"""

SCRIPT = """
import json
import sys

import gymnasium as gym
import numpy as np

import parallelenv


class BadEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise ValueError("the env's own step failed")


def bad_function(env):
    raise RuntimeError("the user's function failed")


for mode in sys.argv[1:]:
    penv = parallelenv.ParallelEnv([BadEnv, BadEnv], para_mode=mode)
    try:
        penv.reset(seed=0)
        for call, run in [("step", lambda: penv.step([0, 0])), ("function", lambda: penv.customized_method(bad_function))]:
            try:
                run()
            except parallelenv.EnvError as error:
                print(json.dumps([mode, call, error.remote_traceback]), flush=True)
    finally:
        penv.close()
"""

# What each call raises in: its function in the script, and the line that raises.
RAISES = {"step": ("step", "raise ValueError(\"the env's own step failed\")"),
          "function": ("bad_function", "raise RuntimeError(\"the user's function failed\")")}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("modes", [("dummy", "subproc"), RAY_BACKENDS])
def test_an_env_error_shows_the_users_file_and_line(tmp_path, no_leaks, modes):
    if modes == RAY_BACKENDS:
        pytest.importorskip("ray")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(DYNAMIC_CODE)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(script), *modes], capture_output=True, text=True, timeout=220,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    tracebacks = {(mode, call): text for mode, call, text in map(json.loads, done.stdout.splitlines())}
    lines = [line.strip() for line in SCRIPT.splitlines()]
    missing = []
    for mode in modes:
        for call, (function, source) in RAISES.items():
            text = tracebacks.get((mode, call))
            assert text is not None, f"{mode}: {call} raised no EnvError\n{done.stdout}\n{done.stderr}"
            frame = f'  File "{script}", line {lines.index(source) + 1}, in {function}\n    {source}\n'
            if frame not in text:
                missing.append(f"{mode} {call}:\n{text}")
    assert not missing, "tracebacks without the script's file and line:\n" + "\n".join(missing)
