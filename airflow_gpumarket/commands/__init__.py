"""The ``airflow gpumarket`` commands: ``doctor``, ``rentals``, ``orphans`` and ``spend``.

Airflow 3.2+ reads them from the provider info's ``cli`` entry (``definition.get_gpumarket_cli_commands``); before
that (2.11, 3.0, 3.1) ``python -m airflow_gpumarket`` runs the same ones. Each command's module is imported only when
it runs.
"""
