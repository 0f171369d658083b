"""The instance list as a state machine: which pages to ask for, in order, what they found (no transport)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpumarket.types import Instance

from airflow_gpumarket.api.paths import PATH_INSTANCES, PATH_INSTANCES_V1
from airflow_gpumarket.api.responses import expect_list
from airflow_gpumarket.api.validation import require_positive_int, require_text
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketError,
)

#: Page size of ``GET /api/v1/instances/``: the live service's maximum (it reads a limit <= 0 as 5).
LIST_PAGE_LIMIT = 25
#: A walk through more pages than this fails instead of going on: 10,000 instances is far beyond any account
#: this provider serves, so it means a server that keeps handing out tokens.
MAX_LIST_PAGES = 400


class InstanceListing:
    """One walk through the instance list: which requests to send, in order, and what they found.

    The live service lists instances through the paged ``GET /api/v1/instances/`` (its ``/api/v0/instances/``
    answers 410); a server that follows the spec only has ``GET /api/v0/instances/``. Both hooks drive this
    object the same way: :meth:`request` gives the next ``(path, query)`` or None when the walk is over,
    :meth:`take` reads the answer, :attr:`instances` holds the result. ``label`` and ``ids`` are sent as
    server-side filters (ids in chunks of one page) and applied again here, so a server that ignores a filter
    costs pages, never wrong answers.
    """

    def __init__(
        self,
        *,
        label: str | None = None,
        ids: Iterable[int] | None = None,
        v1: bool = True,
        page_limit: int | None = None,
        max_pages: int | None = None,
    ) -> None:
        if label is not None:
            require_text("label", label)
        wanted: list[int] | None = None
        if ids is not None:
            wanted = sorted(set(ids))
            for instance_id in wanted:
                require_positive_int("ids", instance_id)
        page_limit = LIST_PAGE_LIMIT if page_limit is None else page_limit
        self.label = label
        self.ids = frozenset(wanted) if wanted is not None else None
        self.v1 = v1
        self.page_limit = page_limit
        self.max_pages = MAX_LIST_PAGES if max_pages is None else max_pages
        self._by_id: dict[Any, Any] = {}
        self._chunks: list[list[int] | None] = (
            [None] if wanted is None else [wanted[i : i + page_limit] for i in range(0, len(wanted), page_limit)]
        )
        self._token: str | None = None
        self._seen_tokens: set[str] = set()
        self._pages = 0

    @property
    def instances(self) -> list[Instance]:
        return list(self._by_id.values())

    def request(self) -> tuple[str, dict[str, str] | None] | None:
        if not self._chunks:
            return None
        if not self.v1:
            return PATH_INSTANCES, None
        params = {"limit": str(self.page_limit)}
        filters: dict[str, Any] = {}
        if self.label is not None:
            filters["label"] = {"eq": self.label}
        chunk = self._chunks[0]
        if chunk is not None:
            filters["id"] = {"in": chunk}
        if filters:
            params["select_filters"] = json.dumps(filters, separators=(",", ":"))
        if self._token is not None:
            params["after_token"] = self._token
        return PATH_INSTANCES_V1, params

    def take(self, body: Any) -> None:
        page = expect_list("list_instances", body, "instances")
        for instance in page:
            if isinstance(instance, dict) and self._wanted(instance):
                self._by_id[instance.get("id")] = instance  # a page boundary that moved may repeat one
        self._pages += 1
        token = body.get("next_token") if self.v1 and isinstance(body, dict) else None
        if token is None or token == "":
            self._chunks.pop(0)
            self._token = None
            return
        token = str(token)
        if token in self._seen_tokens or self._pages >= self.max_pages:
            raise GpuMarketError(
                f"list_instances: the service kept answering with more pages ({self._pages} read, "
                f"next_token {token[:40]!r}); stopped so as not to loop forever. Try again later.",
                status_code=200,
                operation="list_instances",
            )
        self._seen_tokens.add(token)
        self._token = token

    def use_v0(self) -> None:
        """Start again on the spec's single-page ``GET /api/v0/instances/``."""
        self.v1 = False
        self._by_id.clear()
        self._chunks = [None]
        self._token = None
        self._pages = 0

    def _wanted(self, instance: Mapping[str, Any]) -> bool:
        if self.label is not None and instance.get("label") != self.label:
            return False
        return self.ids is None or instance.get("id") in self.ids


def falls_back_to_v0(exc: GpuMarketError) -> bool:
    """True when ``/api/v1/instances/`` does not exist on this server (an older or spec-only one)."""
    return exc.status_code in (404, 405) and not isinstance(exc, GpuMarketAuthError)


def listing_total(body: Any) -> int:
    """How many instances a list answer says there are (v1's ``total_instances``, else its list's length)."""
    if isinstance(body, dict):
        total = body.get("total_instances", body.get("instances_found"))
        if isinstance(total, int) and not isinstance(total, bool):
            return total
        if isinstance(body.get("instances"), list):
            return len(body["instances"])
    return 0


def find_by_label(instances: Iterable[Mapping[str, Any]], label: str) -> Instance | None:
    """The newest instance carrying ``label`` (highest id), or None."""
    matches = [i for i in instances if i.get("label") == label]
    return max(matches, key=lambda i: i.get("id") or 0) if matches else None  # type: ignore[return-value]
