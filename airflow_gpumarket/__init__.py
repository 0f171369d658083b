"""Apache Airflow provider for a GPU-rental marketplace.

Importing the package is cheap on purpose: DAG files are parsed constantly.
"""

__version__ = "0.1.0"
