"""The credential guard: a table of shapes refused and of ordinary data that must pass."""

from __future__ import annotations

import pytest

from outbox_lite import CredentialInPayloadError, OutboxRepository, PayloadError
from outbox_lite.payload import encode_payload, redact

# Built at run time so that no scanner mistakes this test table for leaked secrets.
GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = ("eyJhbGciOiJIUzI1NiJ9" + "." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" + "."
       + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----"

REFUSED = [
    # (payload, JSON path named in the error)
    ({"password": "hunter2"}, "$.password"),
    ({"db_password": "x9"}, "$.db_password"),
    ({"userPassword": "x9"}, "$.userPassword"),
    ({"passwd": "x9"}, "$.passwd"),
    ({"credentials": {"user": "bob", "pass": "x9"}}, "$.credentials.pass"),
    ({"pwd": "x9"}, "$.pwd"),
    ({"passphrase": "correct horse"}, "$.passphrase"),
    ({"secret": "s3"}, "$.secret"),
    ({"client_secret": "s3"}, "$.client_secret"),
    ({"token": "t0k"}, "$.token"),
    ({"access_token": "t0k"}, "$.access_token"),
    ({"refreshToken": "t0k"}, "$.refreshToken"),
    ({"api_key": "k"}, "$.api_key"),
    ({"apiKey": "k"}, "$.apiKey"),
    ({"X-Api-Key": "k"}, '$["X-Api-Key"]'),
    ({"private_key": "k"}, "$.private_key"),
    ({"aws_secret_access_key": "k"}, "$.aws_secret_access_key"),
    ({"Authorization": "anything"}, "$.Authorization"),
    ({"cookie": "sid=1"}, "$.cookie"),
    ({"Set-Cookie": "sid=1"}, '$["Set-Cookie"]'),
    ({"credentials": "user:pw"}, "$.credentials"),
    ({"session_id": "abc"}, "$.session_id"),
    ({"pin": 1, "password": 123456}, "$.password"),
    ({"a": {"b": [{"c": {"secret": "deep"}}]}}, "$.a.b[0].c.secret"),
    ({"headers": [["Accept", "json"], ["x", "Bearer abcdef0123456789ghijKLMN"]]},
     "$.headers[1][1]"),
    ({"tokens_list": ["ok"], "api_keys": ["k1", "k2"]}, "$.api_keys[0]"),
    ({"h": "Basic dXNlcjpwYXNzd29yZA=="}, "$.h"),
    ({"h": "Bearer\tabcdef0123456789ghijKLMN"}, "$.h"),  # escaped in JSON text: still found
    ({"cert": PEM}, "$.cert"),
    ({"session": JWT}, "$.session"),
    ({"cfg": {"aws": AWS}}, "$.cfg.aws"),
    ({"gh": GH}, "$.gh"),
    ({"s": "xoxb-" + "123456789012-abcdefABCDEF"}, "$.s"),
    ({"k": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"}, "$.k"),
    ({"k": "sk-proj-" + "abcDEF123ghiJKL456mnoPQR789"}, "$.k"),
    ({"k": "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"}, "$.k"),
    ({"k": "glpat-" + "xxxxxxxxxxxx1234abcd"}, "$.k"),
    ({"dsn": "postgres://app:s3cr3t@db:5432/app"}, "$.dsn"),
    ({"callback": "https://user:pa55@example.com/hook"}, "$.callback"),
    ({"url": "redis://:sekret@cache:6379/0"}, "$.url"),
    ({"conn": "Server=db;User Id=app;Password=Pa55w0rd;"}, "$.conn"),
    ({"link": "https://example.com/cb?token=abc123def"}, "$.link"),
    ({"azure": "DefaultEndpointsProtocol=https;AccountKey=" + "a" * 30 + "=="}, "$.azure"),
    ({"hook": "https://hooks.slack.com/services/T000/B000/XXXXXXXX"}, "$.hook"),
    ([{"ok": 1}, {"token": "t"}], "$[1].token"),
    ({GH: "value"}, f"$.{GH}"),
]

ALLOWED = [
    {"tokenCount": 1200},
    {"max_tokens": 512, "prompt_tokens": 100, "completion_tokens": 20},
    {"passwordChangedAt": "2026-01-01T00:00:00Z"},
    {"password_set": True},
    {"test": "lint", "pass": True, "bypass_cache": "yes"},
    {"password": None},
    {"password": ""},
    {"secret_name": "prod/db"},
    {"token_type": "Bearer"},
    {"key": "colour"},
    {"keys": ["a", "b"]},
    {"message": "Please reset your password: click the link we sent."},
    {"note": "The bearer of this letter is a friend."},
    {"text": "basic understanding of the secret garden"},
    {"library": "scikit-learn sk-learn-is-a-machine-learning-library"},
    {"author": "user@example.com", "site": "https://example.com/path?q=1"},
    {"access_key_id_rotated": True},
    {"aws_region": "eu-west-1", "bucket": "reports"},
    {"sha": "3f786850e387550fdab836ed7e6dc881de23001b"},
    {"uuid": "123e4567-e89b-12d3-a456-426614174000"},
    {"cookie_consent": True},
    {"authorized": False, "author": "Ann"},
    {"header": "Accept: application/json"},
    {"description": "Configure auth=oauth in settings"},
    {"n": 1.5, "list": [1, 2, 3], "empty": {}, "nested": [[[]]]},
]


@pytest.mark.parametrize("payload,path", REFUSED)
def test_credentials_are_refused_with_their_path_and_never_their_value(payload, path):
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload(payload)
    assert info.value.path == path
    text = str(info.value)
    assert path in text
    for secret in ("hunter2", "x9", "s3cr3t", "pa55", "Pa55w0rd", GH, JWT, AWS, "abc123def"):
        if secret != path.lstrip("$."):
            assert secret not in text


@pytest.mark.parametrize("payload", ALLOWED)
def test_ordinary_data_passes(payload):
    assert encode_payload(payload)


def test_the_table_is_as_large_as_promised():
    assert len(REFUSED) >= 30 and len(ALLOWED) >= 20


def test_a_service_can_allow_a_key_it_knows_is_safe(db, clock, fetch):
    repo = OutboxRepository(db, clock=clock, allowed_payload_keys=["idempotency_token"])
    with db.atomic():
        repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                   payload={"idempotencyToken": "public-123"})
        with pytest.raises(CredentialInPayloadError):
            repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="2",
                                       payload={"token": "t", "idempotency_token": "x"})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]


def test_credential_error_is_a_payload_error_and_a_value_error():
    with pytest.raises(PayloadError):
        encode_payload({"password": "x"})
    with pytest.raises(ValueError):
        encode_payload({"password": "x"})


@pytest.mark.parametrize("text,leak,kept", [
    ("connect mysql://app:s3cr3t@db/app failed", "s3cr3t", "mysql://app:***@db/app"),
    ("401 for Bearer abcdEFGH1234ijklMNOP5678", "abcdEFGH1234ijklMNOP5678", "Bearer ***"),
    ("login password=hunter2 rejected", "hunter2", "password=***"),
    ("GET /cb?token=abc123def&x=1", "abc123def", "token=***&x=1"),
    ("jwt " + JWT + " expired", JWT, "jwt *** expired"),
    ("key " + AWS + " denied", AWS, "key *** denied"),
    (PEM, "MIIEowIBAAKCAQEA7", "-----BEGIN RSA PRIVATE KEY-----***"),
])
def test_redact_masks_credentials_in_free_text(text, leak, kept):
    masked = redact(text)
    assert leak not in masked
    assert kept in masked


def test_redact_leaves_ordinary_text_alone():
    text = "broker at amqp://broker:5672 refused the connection (timeout after 30 s)"
    assert redact(text) == text
