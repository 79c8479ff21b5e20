"""A small AST mutator of our own: ``python -m tests.mutation`` (see docs/mutation.md).

:mod:`.mutants` finds and writes mutants, :mod:`.select` picks the test files that cover a module,
:mod:`.run` runs them in copies of the repository, :mod:`.__main__` samples, runs and reports.
"""
