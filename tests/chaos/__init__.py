"""The exactly-once chaos test: bank transfers committed by killable workers through a faulty network.

- :mod:`tests.chaos.bank`: the worker process (commits transfers, following the documented retry rules).
- :mod:`tests.chaos.verify`: the verifier (replays the change feed and checks every timestamp).
- :mod:`tests.chaos.driver`: runs moto, the fault proxy, workers, CLI commands and kills; returns a result.

``tests/chaos/test_chaos.py`` runs the short profile; ``benchmarks/chaos.py`` the long one.
"""
