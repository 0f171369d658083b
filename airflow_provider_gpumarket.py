"""The module named after the distribution, which Airflow 3's example DAG discovery imports; empty on purpose.

Airflow derives the module to import from the distribution's name (``airflow-provider-gpumarket``), not from the
provider info. Without this module it logs a ``ModuleNotFoundError`` whenever ``[core] load_examples`` is on. Being a
module and not a package, it has no ``example_dags`` folder: the provider adds no example DAGs to Airflow's.
"""
