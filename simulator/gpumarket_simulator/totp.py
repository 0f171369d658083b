"""RFC 6238 time-based one-time passwords (HMAC-SHA1, 30-second step, 6 digits), against any clock."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

STEP_SECONDS = 30
DIGITS = 6


def totp(secret_b32: str, at: float, step: int = STEP_SECONDS, digits: int = DIGITS) -> str:
    """The code valid at epoch second ``at`` for a base32 secret (padding optional, case-insensitive)."""
    key = base64.b32decode(secret_b32.upper() + "=" * (-len(secret_b32) % 8))
    counter = int(at // step)
    digest = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    value = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(value % 10**digits).zfill(digits)


def verify(secret_b32: str, code: str, at: float, window: int = 1) -> bool:
    """Accept the current step and ``window`` steps either side, as authenticator apps drift a little."""
    if not isinstance(code, str) or len(code) != DIGITS or not code.isdigit():
        return False
    return any(hmac.compare_digest(totp(secret_b32, at + k * STEP_SECONDS), code) for k in range(-window, window + 1))
