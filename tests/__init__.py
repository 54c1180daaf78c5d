"""The test suite, a package mirroring the code: tests/persist, tests/txns, tests/db (txns.db),
tests/spark (txns.spark), tests/cli (txns.cli), plus the harnesses tests/isolation and
tests/chaos (with their tests), and tests of the docs (doctests, README) here.

Every directory is a package, so pytest imports test modules by their full
name (``tests.persist.test_url``) with the repository root on ``sys.path``,
never a test directory (``tests/persist`` there would shadow the ``persist``
library). Worker processes run as ``python -m tests.chaos.bank`` from the root.
"""
