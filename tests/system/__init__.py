"""System tests: a production-shaped Airflow deployment against the simulator, with faults on purpose (make system).

Run with ``pytest tests/system -m system -s``; ``--shape small`` deploys the LocalExecutor with one scheduler and
one triggerer and leaves out the tests marked production_shape. ``make test`` deselects them (``-m "not system"``).
"""
