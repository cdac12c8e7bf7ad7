"""Gymnasium's and Stable-Baselines3's own vector-env test suites, run against our views.

``python -m compat`` (``make compat``) fetches the peers' tests into a scratch
directory outside the repository (:mod:`compat.sources`), runs them with
:mod:`compat.shim` swapping the peers' vector-env classes for our views, once
per ParallelEnv backend and once unswapped as a reference, and sorts every
failure (:mod:`compat.run`) by the reasons kept in :mod:`compat.known`. Their
tests stay theirs: nothing of them is copied into this repository.
"""
