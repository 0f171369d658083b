"""Two-factor authentication: the account's methods and codes, and the regeneration of its backup codes."""

from __future__ import annotations

import hmac
import random
from typing import Any

from gpumarket_simulator import totp
from gpumarket_simulator.errors import bad_request

BACKUP_CODES_PER_REGENERATION = 10


class TwoFactor:
    """The account's two-factor settings (``tfa`` of the world file); codes come from the world's outcome stream."""

    def __init__(self, tfa: dict[str, Any], rng: random.Random) -> None:
        self.tfa = tfa
        self.rng = rng

    def regen_backup_codes(self, request: dict[str, Any], now: float) -> dict[str, Any]:
        tfa = self.tfa
        if "backup_code" in request:
            if request["backup_code"] not in tfa["backup_codes"]:
                raise bad_request("The backup code is wrong or was already used", "invalid_backup_code")
        else:
            method = request.get("tfa_method")
            if "tfa_method_id" in request:
                known = {m["id"]: m["method"] for m in tfa["methods"]}
                by_id = known.get(request["tfa_method_id"])
                if by_id is None:
                    raise bad_request(f"No two-factor method with id {request['tfa_method_id']}", "no_such_method")
                if method is not None and method != by_id:
                    raise bad_request(f"tfa_method_id {request['tfa_method_id']} is a {by_id} method, not {method}")
                method = by_id
            if method == "totp":
                if not totp.verify(tfa["totp_secret"], request["code"], now):
                    raise bad_request("The verification code is wrong or expired", "invalid_code")
            else:
                if "secret" not in request:
                    raise bad_request(f"secret (the tfa_secret from the send step) is required for {method}")
                if not (
                    hmac.compare_digest(request["secret"], tfa["tfa_secret"])
                    and hmac.compare_digest(request["code"], tfa["code"])
                ):
                    raise bad_request("The verification code or secret is wrong or expired", "invalid_code")
                # A sent code works once: the next send step would issue a new one.
                tfa["code"] = f"{self.rng.randrange(10**6):06d}"
                tfa["tfa_secret"] = f"{self.rng.getrandbits(128):032x}"
        codes = [f"{self.rng.getrandbits(40):010x}" for _ in range(BACKUP_CODES_PER_REGENERATION)]
        tfa["backup_codes"] = codes
        return {
            "msg": "New backup codes generated; the previous codes no longer work.",
            "backup_codes": list(codes),
        }

    def view(self, now: float) -> dict[str, Any]:
        """The settings as ``/_sim/state`` shows them, with the TOTP code of ``now``."""
        return {
            **{k: v for k, v in self.tfa.items() if k != "backup_codes"},
            "totp_code": totp.totp(self.tfa["totp_secret"], now),
            "backup_codes": list(self.tfa["backup_codes"]),
        }
