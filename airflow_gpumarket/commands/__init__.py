"""The ``airflow gpumarket`` commands: ``doctor``, ``rentals``, ``orphans`` and ``spend``.

Airflow 3 reads them from the provider info's ``cli`` entry (``definition.get_gpumarket_cli_commands``); on Airflow 2.11
``python -m airflow_gpumarket`` runs the same ones. Each command's module is imported only when it runs.
"""
