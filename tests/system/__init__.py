"""A production-shaped Airflow deployment against the simulator, for `make system` and the benchmarks."""
