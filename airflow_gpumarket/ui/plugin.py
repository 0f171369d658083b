"""The provider's Airflow plugin: the GPU rentals page in the Airflow UI (Airflow 3.1+).

Registered through the ``airflow.plugins`` entry point (and the provider info's ``plugins``). Every Airflow process
that loads plugins imports this module, so it stays light: the page's FastAPI app (``app.py``) is built on the
first request the api-server routes to it. Airflow 2.11 and 3.0 ignore the attributes they do not know; there the
"GPU rental" link of each task still records and shows its rental's address (see the README).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

#: Where the api-server mounts the page's app; the UI's menu entry points at it relative to the UI's base URL.
URL_PREFIX = "/gpumarket"


class _AppOnFirstRequest:
    """An ASGI app that builds the page's FastAPI app when the first request reaches it."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_gpumarket.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class GpuMarketPlugin(AirflowPlugin):
    name = "gpumarket"
    fastapi_apps = [{"app": _AppOnFirstRequest(), "url_prefix": URL_PREFIX, "name": "GPU rentals"}]
    # In the UI's Browse menu, shown inside the UI (url_route); the href has no leading slash, so the page works
    # behind a reverse proxy that serves Airflow under a path.
    external_views = [
        {
            "name": "GPU rentals",
            "href": f"{URL_PREFIX.lstrip('/')}/",
            "url_route": "gpu-rentals",
            "destination": "nav",
            "category": "browse",
        }
    ]
