"""Searching offers as a task of its own: the matching offers go to XCom."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import is_templated

if TYPE_CHECKING:
    from airflow_gpumarket.types import Offer


class GpuMarketSearchOffersOperator(GpuMarketBaseOperator):
    """Search offers and push them to XCom.

    :param offer_filters: the spec's filter object, e.g. ``{"gpu_name": {"eq": "RTX 4090"}}``, on fields the service
        filters on (``api.OFFER_FILTER_FIELDS``).
    :param extra_filter_fields: offer fields newer than this provider that ``offer_filters`` may name.
    :param offer_type: ``ondemand`` (default), ``on-demand`` or ``bid``.
    :param offer_order: list of ``[field, direction]`` pairs, e.g. ``[["dph_total", "asc"]]``.
    :param limit: maximum number of offers.
    :param max_dph: drop offers dearer than this many dollars per hour.
    """

    template_fields: Sequence[str] = ("offer_filters", "offer_type", "offer_order", "limit", "max_dph")

    def __init__(
        self,
        *,
        offer_filters: Mapping[str, Any] | None = None,
        extra_filter_fields: Sequence[str] = (),
        offer_type: str = "ondemand",
        offer_order: list | None = None,
        limit: int | None = None,
        max_dph: float | None = None,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.offer_filters = offer_filters
        self.extra_filter_fields = extra_filter_fields
        self.offer_type = offer_type
        self.offer_order = offer_order
        self.limit = limit
        self.max_dph = max_dph
        if not any(is_templated(v) for v in (offer_filters, offer_type, offer_order, limit, max_dph)):
            self._validate()

    def _validate(self) -> None:
        api.build_search_body(
            self.offer_filters,
            offer_type=self.offer_type,
            limit=self.limit,
            order=self.offer_order,
            extra_fields=api.require_field_names("extra_filter_fields", self.extra_filter_fields),
            argument="offer_filters",
        )
        if self.max_dph is not None:
            api.require_positive_number("max_dph", self.max_dph)

    def execute(self, context: Any) -> list[Offer]:
        self._validate()
        offers = self.hook.search_offers(
            self.offer_filters,
            offer_type=self.offer_type,
            limit=self.limit,
            order=self.offer_order,
            extra_filter_fields=self.extra_filter_fields,
        )
        if self.max_dph is not None:
            offers = [o for o in offers if (o.get("dph_total") or 0) <= self.max_dph]
        self.log.info("Found %d offer(s)", len(offers))
        for offer in offers[:10]:
            self.log.info(
                "  offer %s: %sx %s at $%s/h, reliability %s",
                offer.get("id"),
                offer.get("num_gpus"),
                offer.get("gpu_name"),
                offer.get("dph_total"),
                offer.get("reliability"),
            )
        return offers
