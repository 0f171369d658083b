"""The GPU rentals view: what renting tasks record, the page in the Airflow UI (3.1+), and the task link."""
