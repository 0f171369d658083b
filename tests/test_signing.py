"""The signed requests' protocol, both ends' part: what the signature covers and which headers carry it."""

from __future__ import annotations

import pytest

from airflow_gpumarket import signing

PARTS = {"method": "POST", "route": "/ledger/attach", "conn_id": "gpumarket_default", "timestamp": "100",
         "nonce": "n" * 16, "body": b"{}"}  # fmt: skip


@pytest.mark.parametrize(
    ("part", "other"),
    [
        ("method", "PUT"),
        ("route", "/ledger/settle"),
        ("conn_id", "gpumarket_other"),
        ("timestamp", "101"),
        ("nonce", "m" * 16),
        ("body", b"{ }"),
    ],
)
def test_rule_the_signature_covers_method_route_connection_time_nonce_and_body(part, other):
    one = signing.signature("key", **PARTS)
    assert one == signing.signature("key", **PARTS)
    assert one != signing.signature("other", **PARTS)
    assert one != signing.signature("key", **{**PARTS, part: other})


def test_parts_cannot_be_shifted_from_one_field_into_another():
    """The connection is percent-encoded, so no field can end in what the next one starts with."""
    one = signing.material(**{**PARTS, "conn_id": "a\nPOST"})
    assert one.count(b"\n") == signing.material(**PARTS).count(b"\n")


def test_the_headers_carry_a_connection_id_of_any_characters_and_read_back():
    conn_id = "équipe/gpu:1 #2"
    sent = signing.headers(conn_id=conn_id, timestamp="100", nonce="n" * 16, signature="a" * 64)
    assert all(value.isascii() for value in sent.values())
    assert signing.read_headers(sent) == signing.Headers("100", "n" * 16, conn_id, "a" * 64)


GOOD = signing.headers(conn_id="c", timestamp="100", nonce="n" * 16, signature="a" * 64)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (signing.TIMESTAMP, "²"),  # a digit to str.isdigit, not to int()
        (signing.TIMESTAMP, "1" * 400),
        (signing.TIMESTAMP, ""),
        (signing.NONCE, "short"),
        (signing.SIGNATURE, "é" * 64),
        (signing.SIGNATURE, "A" * 64),
        (signing.SIGNATURE, "a" * 63),
        (signing.CONNECTION, ""),
        (signing.CONNECTION, "%FF%FE"),  # not UTF-8
        (signing.CONNECTION, "%00"),
        (signing.CONNECTION, "a" * 251),
    ],
)
def test_a_malformed_header_is_refused_naming_it(header, value):
    with pytest.raises(signing.Unsigned, match=header):
        signing.read_headers({**GOOD, header: value})


def test_comparing_signatures_never_raises():
    assert signing.matches("a" * 64, "a" * 64)
    assert not signing.matches("a" * 64, "é" * 64)
    assert not signing.matches("a" * 64, "")
