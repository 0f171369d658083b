"""The sensors that call the service read the hook tests' connection (``hook_fakes``)."""

from hook_fakes import gpumarket_conn  # noqa: F401 - a fixture of this folder
