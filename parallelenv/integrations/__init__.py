"""Views of a ParallelEnv through the vector-env interfaces of other libraries.

Each lives in its own module and imports its library only when loaded:
:mod:`parallelenv.integrations.gymnasium` and :mod:`parallelenv.integrations.sb3`.
"""
