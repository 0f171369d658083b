"""Host volume listings: the asks the account offers its own machines' disks under, one per machine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpumarket_simulator.errors import ApiError, bad_request

if TYPE_CHECKING:
    from gpumarket_simulator.instances import Instance
    from gpumarket_simulator.offers import Machine


class VolumeListings:
    """The account's volume asks by machine id; the world's machines and live instances are read, never written."""

    def __init__(self, machines: Mapping[int, Machine], live: Mapping[int, Instance], user_id: int) -> None:
        self.machines = machines
        self.live = live
        self.user_id = user_id
        self.asks: dict[int, dict[str, Any]] = {}
        self._next_id = 5_000_001

    def create(self, machine_ids: list[int], hidden: bool | None, sent: dict[str, Any]) -> dict[str, Any]:
        """``POST /volumes/``: an ask for each of the account's online machines, or its existing ask updated."""
        machines = [self.machines.get(i) for i in machine_ids]
        if any(m is None or not m.owned for m in machines):
            raise bad_request("No such machine(s) for your account", "no_such_machine")
        offline = [m.id for m in machines if m is not None and not m.online]
        if offline:
            raise ApiError(
                402,
                "machine_offline",
                f"Asks can only be created for an online machine; offline: {', '.join(map(str, offline))}",
                extra={"success": False},
            )
        results = []
        for machine in machines:
            assert machine is not None
            ask = self.asks.get(machine.id)
            new_contracts: list[dict[str, Any]] = []
            upd_contracts: list[int] = []
            if ask is None:
                ask = {
                    "id": self._next_id,
                    "machine_id": machine.id,
                    "size": machine.disk_gb,
                    "hidden": False,
                }
                self._next_id += 1
                self.asks[machine.id] = ask
                new_contracts.append({"id": ask["id"], "size": ask["size"]})
            else:
                upd_contracts.append(ask["id"])
            if hidden is not None:
                ask["hidden"] = hidden
            results.append(
                {
                    "machine_id": machine.id,
                    "user_id": self.user_id,
                    "extended": sum(1 for i in self.live.values() if i.offer.machine_id == machine.id),
                    "new_contracts": new_contracts,
                    "upd_contracts": upd_contracts,
                }
            )
        return {"success": True, "you_sent": sent, "results": results}

    def view(self) -> list[dict[str, Any]]:
        return [dict(a) for a in self.asks.values()]
