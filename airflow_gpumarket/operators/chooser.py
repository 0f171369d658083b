"""Which offer a renting task rents next: its search, host memory's skips, the expected-cost ranking, its worst case.

The ``RentalSession`` asks ``OfferChooser.next_offer`` before each create, and gets a ``Pick`` (the offer, its bid,
its worst case) or why there is none; it tells ``remember`` which machines failed. The rules are pure functions
below the class (the search, the offer taken from its answer, the terms of an offer), which send nothing. Host
memory (``host_memory.py``, reached through ``host_memory_client``) helps to choose and never stops a rental: when it
cannot be reached the try goes on without it, and says so once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, bidding, budgets, lifecycle
from airflow_gpumarket.operators import host_memory_client

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.lifecycle import Attempts
    from airflow_gpumarket.offer_cost import CostModel
    from airflow_gpumarket.operators.spec import RentalSpec
    from airflow_gpumarket.task_history import Learned

#: Offers a search asks for beyond those tried and the machines lost, so that an untried one is among them.
SEARCH_MARGIN = 10
#: Offers an expected-cost choice ranks (the cheapest per hour of the search): a faster or steadier host among them
#: may be the cheaper way to finish.
RANKED_OFFERS = 50


@dataclass(frozen=True)
class Pick:
    """The offer to rent next: its bid (None on demand), the worst case its rental reserves, the GPUs it promises."""

    offer: Mapping[str, Any]
    bid: float | None
    worst: budgets.WorstCase
    gpus: int


class OfferChooser:
    """The offer choice of one try: host memory read once, the cost model made once, each search's offers ordered.

    :param hook: the task's hook.
    :param log: the task's logger.
    :param spec: the task's arguments, rendered and checked.
    :param conn_id: the connection (host memory is per account: its API key).
    :param task_ids: the task's DAG id and task id (its earlier durations).
    """

    def __init__(
        self, hook: GpuMarketHook, log: Any, spec: RentalSpec, *, conn_id: str, task_ids: tuple[str, str]
    ) -> None:
        self.hook = hook
        self.log = log
        self.spec = spec
        self._conn_id = conn_id
        self._task_ids = task_ids
        self._hosts: Any = None  # host memory's client, made on first use; False once it could not be reached
        self._avoided: Mapping[int, Any] = {}
        self._model: CostModel | None = None
        self._history: Learned | None = None  # read once
        self._last: tuple[dict[str, Any], list] | None = None  # the last search and what it listed

    def start(self) -> None:
        """Before the first offer of a ``rent``: host memory read (not for a pinned offer), the cost model made."""
        self._avoided = self.avoided() if self.spec.pinned_offer is None else {}
        if self.spec.offer_choice == "expected_cost" and self._model is None:
            self._model = self.cost_model()

    def next_offer(self, attempts: lifecycle.Attempts, *, first: bool = False) -> Pick | str:
        """Search, and the offer to rent next with its terms; or, when there is none, why.

        ``first``: the first offer of a ``rent``, before which host memory is read again (``start``).
        """
        if first:
            self.start()
        spec = self.spec
        search = search_for(spec, attempts, len(self._avoided))
        if search is None:
            return "no further matching offer"
        filters = search.pop("filters")
        listed = self.hook.search_offers(filters, **search)
        self._last = ({**search, "filters": filters}, listed)
        found, lines, skipped = ordered(listed, spec, attempts, avoided=self._avoided, model=self._model)
        for line in lines:
            self.log.info("Offer choice: %s", line)
        matching = any(api.filter_mismatch(offer, filters) is None for offer in listed)
        if not matching and spec.pinned_offer is None:  # not one tried, priced out or on an avoided machine
            return matched_none(filters, search["offer_type"], listed)
        offer, bid, why_not = next_offer(found, spec, attempts)
        if offer is None:
            return why_not + (f" ({skipped} more on machines in host memory)" if skipped else "")
        return Pick(offer, bid, worst_case(spec, offer, bid), gpu_count(offer))

    def unmatched(self) -> dict[str, Any] | None:
        """The last search, which found nothing to rent: what it searched, the offers it saw, the machines skipped."""
        if self._last is None or self.spec.pinned_offer is not None:
            return None
        search, listed = self._last
        watch = {
            "filters": dict(search["filters"] or {}),
            "offer_type": search["offer_type"],
            "max_dph": self.spec.max_dph,
            "extra_filter_fields": list(search["extra_filter_fields"] or ()),
        }
        seen = [o["id"] for o in listed if isinstance(o.get("id"), int)]
        return {"watch": watch, "seen_offers": seen, "avoided_machines": list(self._avoided)}

    def host_memory(self) -> Any:
        """Host memory's client, or None when it is off or could not be reached (renting goes on without it)."""
        if not self.spec.avoid_failed_hosts or self._hosts is False:
            return None
        if self._hosts is None:
            try:
                self._hosts = host_memory_client.host_memory_client(self.hook, self._conn_id)
            except Exception as exc:  # noqa: BLE001 - host memory helps choose; it never stops a rental
                self._host_memory_failed(exc)
                return None
        return self._hosts

    def _host_memory_failed(self, exc: BaseException) -> None:
        self._hosts = False
        self.log.warning(
            "Host memory could not be reached (%s): this try neither skips nor remembers failed machines. Install "
            "the provider on the api-server, or set avoid_failed_hosts=False.",
            exc,
        )

    def avoided(self) -> Mapping[int, Any]:
        """The machines host memory skips for this account (none when it cannot be read)."""
        hosts = self.host_memory()
        if hosts is None:
            return {}
        try:
            return dict(hosts.avoided())
        except Exception as exc:  # noqa: BLE001 - see host_memory
            self._host_memory_failed(exc)
            return {}

    def remember_failover(self, rental: lifecycle.Rental, ended: Any, preflight: Any, sentence: str) -> None:
        """Remember the machine of a rental failed over from, when why says something of the host: a failed
        preflight or readiness probe, a boot past its timeout, a failed status (``ended``: the wait's outcome)."""
        from airflow_gpumarket.outcome import EventKind

        if preflight is not None:
            self.remember(rental, "not_ready" if preflight.check == "ready" else "preflight", preflight.describe())
        elif ended.kind is EventKind.BOOT_TIMEOUT:
            self.remember(rental, "boot_timeout", sentence)
        elif ended.actual_status in api.FAILED_STATUSES:
            self.remember(rental, str(ended.actual_status), sentence)

    def remember(self, rental: lifecycle.Rental, reason: str, detail: str) -> None:
        """Put the rental's machine in host memory, so that renting tasks of this account skip it for a while."""
        machine = rental.machine_id
        hosts = self.host_memory() if machine is not None else None
        if hosts is None or machine is None:
            return
        try:
            memory = hosts.remember(int(machine), reason, detail[:500])
        except Exception as exc:  # noqa: BLE001 - see host_memory
            self._host_memory_failed(exc)
            return
        self.log.warning(
            "Machine %s is in host memory for %s (%s): renting tasks of this account skip it until then; "
            "`airflow gpumarket hosts --clear %s` forgets it",
            rental.machine_id,
            lifecycle.format_duration(memory.expires_at - memory.remembered_at),
            reason,
            rental.machine_id,
        )

    def cost_model(self) -> CostModel:
        """What the expected-cost choice assumes of this job: its runtime, its image, its disk."""
        from airflow_gpumarket.offer_cost import (
            DEFAULT_RUNTIME_SECONDS,
            CostModel,
            check_expected_runtime,
            check_transfer_gb,
        )

        spec, source = self.spec, "expected_runtime"
        runtime = check_expected_runtime(spec.expected_runtime)
        if runtime is None:
            runtime, source = self.history().runtime, "the median of this task's earlier successful runs"
        if runtime is None and spec.terms.max_runtime is not None:
            runtime, source = spec.terms.max_runtime, "max_runtime (no earlier successful run)"
        if runtime is None:
            runtime, source = DEFAULT_RUNTIME_SECONDS, "a default (no expected_runtime, max_runtime or earlier run)"
        model = CostModel(expected_runtime=float(runtime), boot_timeout=spec.boot_timeout)
        size, image_source = self.image_size_gb(), "image_size_gb"
        if size is None:
            image_source = "a default: no image_size_gb, and no earlier boot of this image"
        else:
            model = replace(model, image_size_gb=size)
            if spec.image_size_gb is None:
                image_source = "implied by this task's earlier boots of it"
        if (disk := spec.disk_gb) is not None:
            model = replace(model, disk_gb=disk)
        moved = check_transfer_gb(spec.transfer_gb) or (0.0, 0.0)
        model = replace(model, transfer_in_gb=moved[0], transfer_out_gb=moved[1])
        self.log.info(
            "Offer choice by expected cost: the job is expected to run %s (%s), its image to be %.3g GB (%s), to "
            "move %g GB in and %g GB out (transfer_gb)",
            lifecycle.format_duration(model.expected_runtime),
            source,
            model.image_size_gb,
            image_source,
            *moved,
        )
        return model

    def image_size_gb(self) -> float | None:
        """The image's size in GB: ``image_size_gb`` when given, else what the task's earlier boots of it imply."""
        if self.spec.image_size_gb is not None:
            return float(self.spec.image_size_gb)
        return self.history().image_gb

    def history(self) -> Learned:
        """What the task's earlier successes tell (its job's running time, its image's size), read once per try."""
        if self._history is None:
            self._history = self._read_history()
        return self._history

    def _history_client(self) -> Any:
        """The history's client when host memory is off (the same database or api-server routes)."""
        try:
            return host_memory_client.host_memory_client(self.hook, self._conn_id)
        except Exception as exc:  # noqa: BLE001 - defaults stand in
            self.log.warning("Defaults stand in for this task's history: %s", exc)
            return None

    def _read_history(self) -> Learned:
        from airflow_gpumarket.task_history import Learned

        if not all(self._task_ids):  # a task outside a DAG has no history
            return Learned()
        hosts = self.host_memory() if self.spec.avoid_failed_hosts else self._history_client()
        if hosts is None:
            return Learned()
        image = self.spec.instance.get("image")
        try:
            learned = hosts.history(*self._task_ids, image if isinstance(image, str) and image.strip() else None)
        except Exception as exc:  # noqa: BLE001 - defaults stand in
            self.log.warning("Defaults stand in for this task's history: %s", exc)
            return Learned()
        return learned._replace(runtime=learned.runtime if api.is_positive_number(learned.runtime) else None)


def search_for(spec: RentalSpec, attempts: Attempts, avoided: int = 0) -> dict[str, Any] | None:
    """The search (``hook.search_offers``' arguments) that finds the next offer; None when the pinned one was tried.

    A pinned offer is searched for by its id too: its price must be known before its worst case is reserved.
    ``avoided``: how many machines host memory skips, so that the search reaches past them.
    """
    pinned = spec.pinned_offer
    if pinned in attempts.tried:
        return None
    margin = RANKED_OFFERS if spec.offer_choice == "expected_cost" else SEARCH_MARGIN
    return {
        "filters": spec.offer_filters if pinned is None else {"id": {"eq": pinned}},
        "extra_filter_fields": spec.extra_filter_fields,
        "offer_type": "bid" if bids(spec, attempts) else spec.offer_type,
        "order": spec.offer_order or [["dph_total", "asc"]],
        "limit": len(attempts.tried) + len(attempts.lost_machines) + avoided + margin,
    }


def matched_none(filters: Mapping[str, Any] | None, offer_type: str, listed: Sequence[Mapping[str, Any]]) -> str:
    """Why a search that matched no offer rents nothing: its filter, and the command that shows what matches.

    With a ``gpu_name`` filter, the GPU names of offers the search returned anyway (the service ignored a filter).
    """
    said = json.dumps(dict(filters or {}), default=str)
    seen = ""
    if set((filters or {}).get("gpu_name") or {}) & {"eq", "in"}:
        names = sorted({o["gpu_name"] for o in listed if isinstance(o.get("gpu_name"), str)})
        seen = f"; the GPUs it saw are {', '.join(map(repr, names[:10]))}" if names else ""
    return (
        f"the search matched no offer (offer_filters {said}, {offer_type}){seen}. Loosen a filter, and see what "
        f"matches with `airflow gpumarket offers --filters '{said}'`"
    )


def ordered(
    offers: Sequence[Mapping[str, Any]],
    spec: RentalSpec,
    attempts: Attempts,
    *,
    avoided: Mapping[int, Any],
    model: CostModel | None,
) -> tuple[list[Mapping[str, Any]], list[str], int]:
    """The offers in the order they are tried, the task log's lines on the choice, and how many host memory skipped.

    Offers that contradict ``offer_filters`` (the service ignores what it does not know) and offers on machines in
    host memory (``avoided``) are left out. With a ``model`` (``offer_choice="expected_cost"``)
    the offers that have ``offer_terms`` are ranked by their expected cost (``offer_cost``), at the price they would be
    rented at; else the search's order stands.
    """
    lines: list[str] = []
    filters = spec.offer_filters if spec.pinned_offer is None else None
    wrong = {id(offer): why for offer in offers if (why := api.filter_mismatch(offer, filters)) is not None}
    if wrong:
        first = next(offer for offer in offers if id(offer) in wrong)
        lines.append(
            f"{len(wrong)} offer(s) the search returned do not match offer_filters and are skipped (offer "
            f"{first.get('id')}: {wrong[id(first)]}): the service may have ignored a filter"
        )
    offers = [offer for offer in offers if id(offer) not in wrong]
    kept = [offer for offer in offers if offer.get("machine_id") is None or offer.get("machine_id") not in avoided]
    skipped = len(offers) - len(kept)
    if model is not None:
        from airflow_gpumarket import offer_cost

        priced = {}
        for offer in kept:
            price = offer_terms(offer, spec, attempts)[0]
            if price is not None:
                priced[offer.get("id")] = (offer, {**offer, "dph_total": price})
        ranked = offer_cost.rank_offers([pair[1] for pair in priced.values()], model)
        if ranked:
            lines += offer_cost.choice_log(ranked)
        kept = [priced[cost.offer_id][0] for cost in ranked]
    if skipped:
        lines.append(
            f"{skipped} matching offer(s) skipped: their machines failed a rental of this account recently (host "
            "memory: `airflow gpumarket hosts` lists them, `--clear ID` forgets one)"
        )
    return kept, lines, skipped


def bids(spec: RentalSpec, attempts: Attempts) -> bool:
    """Whether the next rental bids (interruptible, and not fallen back to on demand)."""
    return spec.interruptible and not attempts.on_demand


def next_offer(
    offers: Sequence[Mapping[str, Any]], spec: RentalSpec, attempts: Attempts
) -> tuple[Mapping[str, Any] | None, float | None, str]:
    """The offer to rent among ``offers`` (a search's answer) and its bid (None on demand); or no offer, and why.

    The first whose ``offer_terms`` give a price.
    """
    refused: list[tuple[Mapping[str, Any], str]] = []
    for offer in offers:
        price, bid, said = offer_terms(offer, spec, attempts)
        if said:
            refused.append((offer, said))
        if price is not None:
            return offer, bid, ""
    pinned = spec.pinned_offer
    if pinned is not None and not refused and all(offer.get("id") != pinned for offer in offers):
        kind = "bid" if bids(spec, attempts) else spec.offer_type
        why = f"offer_id {pinned} is not found by a search for it ({kind}): it is taken or no longer listed"
        return None, None, why + ", and its price cannot be known before renting"
    return None, None, "no further matching offer" + refusal(refused, spec)


def refusal(refused: Sequence[tuple[Mapping[str, Any], str]], spec: RentalSpec) -> str:
    """What the refused offers say: the lowest ``min_bid`` above its cap when bids were too low, else the last word."""
    max_bid = spec.bidding.max_bid
    too_low = [
        (offer, said)
        for offer, said in refused
        if api.is_positive_number(offer.get("dph_total")) and bidding.above_cap(offer, max_bid)
    ]
    if too_low:
        offer, said = min(too_low, key=lambda pair: pair[0]["min_bid"])
        winnable = max_bid is not None and offer["min_bid"] <= offer["dph_total"]
        fix = f"; raise max_bid to at least ${offer['min_bid']}/h" if winnable else ""
        return f" (the lowest min_bid of the {len(too_low)} offer(s) bid on: {said}{fix})"
    return f" (the last one refused: {refused[-1][1]})" if refused else ""


def offer_terms(
    offer: Mapping[str, Any], spec: RentalSpec, attempts: Attempts
) -> tuple[float | None, float | None, str | None]:
    """The price and bid (None on demand) ``offer`` would be rented at, or a None price; and what its bid or its
    refusal said (None: nothing).

    Never an offer tried already, one on a machine a preemption took, one without a price, or one above ``max_dph``.
    """
    if offer.get("id") in attempts.tried or offer.get("rentable") is False:
        return None, None, None
    if offer.get("machine_id") is not None and offer.get("machine_id") in attempts.lost_machines:
        return None, None, None  # a preemption took this machine: never again
    if not api.is_positive_number(offer.get("dph_total")):
        return None, None, f"offer {offer.get('id')} shows no price (dph_total), so its worst case cannot be reserved"
    bid, said = None, None
    if bids(spec, attempts):
        bid, said = bidding.bid_for(offer, spec.bidding.max_bid)
        if bid is None:
            return None, None, said
    price = bid if bid is not None else offer["dph_total"]
    if spec.max_dph is not None and price > spec.max_dph:
        return None, None, said
    return price, bid, said


def gpu_count(offer: Mapping[str, Any]) -> int:
    """The GPUs the offer promises, which the job wrapper's preflight looks for (0: none checked)."""
    count = offer.get("num_gpus")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def worst_case(spec: RentalSpec, offer: Mapping[str, Any], bid: float | None) -> budgets.WorstCase:
    """The most a rental of ``offer`` may cost: its price over its lease, disk included, capped by max_cost."""
    return budgets.worst_case(
        hourly_price=spec.bidding.reserved_price(offer.get("dph_total"), bid) or 0.0,
        seconds=spec.lease_seconds,
        disk_gb=spec.disk_gb,
        storage_price_per_gb_month=offer.get("storage_cost"),
        max_cost=spec.max_cost,
        overshoot_seconds=spec.poll_interval,
    )
