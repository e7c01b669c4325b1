"""What a consumer receives: an equal JSON value on both servers, or a refusal before any SQL.

MariaDB keeps the JSON text outbox_lite wrote; MySQL's JSON type keeps an equal value in text of
its own (keys sorted, its own spacing) and turns integers beyond 64 bits into floats, with no
error. So those integers are refused on both servers, and everything else must come back equal,
with the same types, whichever server holds it.
"""

from __future__ import annotations

import enum
import json

import pytest

from outbox_lite import PayloadError
from outbox_lite import payload as payload_module
from outbox_lite.payload import MAX_INTEGER, MIN_INTEGER, encode_payload

from _helpers import capture_sql

EVENT = dict(event_type="job.created", aggregate_type="ai_job", aggregate_id="1")

# Each kept exactly by both servers (checked against each, as a value and as its type).
EXACT = {
    "int64 and uint64 ends": [MIN_INTEGER, -1, 0, 2**53 + 1, 2**63 - 1, 2**63, MAX_INTEGER],
    "floats": [0.1, 1 / 3, 1e-7, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
               -0.0, 1.0, 100.0, 1e16, 1e22, 0.30000000000000004, 12345678901234567890.0],
    "text": ["", "\u0000x", "é🚀漢", "\u2028", "line\nbreak\ttab", '"quoted" \\ slash'],
    "shapes": [True, False, None, [], {}, [[[]]], {"": {"": ""}}],
    "key order": {"b": 1, "a": 2, "aa": 3, "A": 4, "é": 5, "10": 6, "9": 7},
}


@pytest.mark.parametrize("name", list(EXACT))
def test_values_come_back_equal_with_their_types_on_this_server(db, repo, fetch, server, name):
    payload = {"values": EXACT[name]}
    with db.atomic():
        event = repo.create_in_transaction(**EVENT, payload=payload)
    with db.atomic():
        [claimed] = repo.claim_batch("w")
    assert claimed.id == event.id

    def same(a, b):  # equal, of the same type, and -0.0 keeps its sign
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(
                same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
        return type(a) is type(b) and a == b and repr(a) == repr(b)

    assert same(claimed.payload, payload), claimed.payload
    [row] = fetch("SELECT payload FROM outbox_event WHERE id = %s", event.id)
    assert same(json.loads(row["payload"]), payload)
    # MariaDB: the very text outbox_lite wrote. MySQL: its own text for the same value (keys
    # sorted, a space after each separator, numbers spelt its way: 1e-07 as 0.0000001).
    assert (row["payload"] == encode_payload(payload)) is server.keeps_json_text


def test_mysql_sorts_keys_and_spaces_the_text_mariadb_keeps_it(db, repo, fetch, server):
    with db.atomic():
        event = repo.create_in_transaction(**EVENT, payload={"job_id": 7, "sizes": [512, 256]})
    [row] = fetch("SELECT payload FROM outbox_event WHERE id = %s", event.id)
    # MariaDB and PostgreSQL (a json column) keep the text; MySQL writes its own.
    assert row["payload"] == ('{"job_id":7,"sizes":[512,256]}' if server.keeps_json_text
                              else '{"sizes": [512, 256], "job_id": 7}')


@pytest.mark.parametrize("number,path", [
    (MAX_INTEGER + 1, "$.n"), (MIN_INTEGER - 1, "$.n"), (10**30, "$.n"), (-(10**30), "$.n"),
    ([1, [2, 2**64]], "$.n[1][1]"),
])
def test_an_integer_mysql_would_turn_into_a_float_is_refused_before_any_sql(
        db, repo, fetch, number, path):
    with db.atomic(), capture_sql(db) as statements:
        with pytest.raises(PayloadError) as caught:
            repo.create_in_transaction(**EVENT, payload={"n": number})
    assert path in str(caught.value) and "send it as a string" in str(caught.value)
    assert str(number) not in str(caught.value)
    assert statements == []
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


def test_long_digit_strings_are_ordinary_data(db, repo, fetch):
    """Digits in strings (ids, card-like numbers) are text and pass; only numbers count."""
    payload = {"order": "123456789012345678901234567890", "neg": "-12345678901234567890",
               "fits": MAX_INTEGER}
    with db.atomic():
        event = repo.create_in_transaction(**EVENT, payload=payload)
    [row] = fetch("SELECT payload FROM outbox_event WHERE id = %s", event.id)
    assert json.loads(row["payload"]) == payload


class _Level(enum.IntEnum):
    HIGH = 3


class _Name(str):
    pass


class _Ratio(float):
    pass


@pytest.mark.parametrize("payload", [
    *({"values": values} for values in EXACT.values()),
    [("a", 1), ("b", [2.5, None])],  # tuples are arrays
    {"level": _Level.HIGH, _Name("name"): _Name("n"), "ratio": _Ratio(0.5)},  # subclasses
    {"nested": {"deep": [{"x": [1, {"y": "é\u2028\"\\"}]}]}},
])
def test_the_stored_text_is_jsons_own_compact_text(payload):
    """The encoder made once (payload._encode) writes what json.dumps would, to the byte."""
    assert encode_payload(payload) == json.dumps(payload, ensure_ascii=False, allow_nan=False,
                                                 separators=(",", ":"))


def test_the_c_encoder_is_made_once_not_per_payload():
    """CPython's C encoder is made at import (JSONEncoder.encode makes one per call)."""
    assert payload_module._encode is not payload_module._ENCODER.encode


@pytest.mark.parametrize("make", [
    lambda: (lambda a: (a.append(a), a)[1])([]),
    lambda: (lambda d: (d.__setitem__("self", d), d)[1])({}),
    lambda: (lambda d: (d.__setitem__("x", [1, d]), d)[1])({}),
])
def test_a_payload_that_holds_itself_is_refused_and_the_next_one_is_not(make):
    """No cycle check in the encoder: a cycle ends as a payload nested too deep, and leaves
    nothing behind for the next payload."""
    with pytest.raises(PayloadError, match="nested deeper than 31 levels"):
        encode_payload(make())
    assert encode_payload({"x": [1, {"y": 2}]}) == '{"x":[1,{"y":2}]}'
