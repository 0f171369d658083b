"""The hook tests' fixtures (``hook_fakes``): the connection, the hook, ``wire``, and the sleep and mask recorders."""

from hook_fakes import gpumarket_conn, hook, masked, server, set_conn, sleeps, wire  # noqa: F401 - fixtures of this folder
