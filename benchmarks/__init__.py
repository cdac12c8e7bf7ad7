"""Speed benchmarks: parallelenv against the vector-env wrappers people use instead.

Run ``python -m benchmarks`` (``--help`` for the flags). Every repeat of every
(workload, wrapper) pair is measured in its own fresh Python process by
:mod:`benchmarks._one`, started by :mod:`benchmarks.child`;
:mod:`benchmarks.__main__` plans the run (the repeats of a workload's wrappers
interleaved, and with ``--against REV`` each of ours twice: the working tree's
parallelenv and REV's, unpacked by :mod:`benchmarks.revision`) and
:mod:`benchmarks.report` turns the results into a table, JSON and a chart.
:mod:`benchmarks.workloads` holds the envs and sizes, the real ones (MuJoCo,
Atari) and their EnvPool twins coming from :mod:`benchmarks.real_envs`.
"""
