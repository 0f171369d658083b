"""Benchmarks; those that start a deployment import tests.system: run them as modules (python -m bench.fleet)."""
