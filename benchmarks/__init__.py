"""Speed benchmarks: parallelenv against the vector-env wrappers people use instead.

Run ``python -m benchmarks`` (``--help`` for the flags). Every (workload,
wrapper) pair is measured in its own fresh Python process by
:mod:`benchmarks._one`; :mod:`benchmarks.__main__` plans the run and
:mod:`benchmarks.report` turns the results into a table, JSON and a chart.
"""
