"""The credential guard's key names, one entry at a time: every word, qualifier, pair, ending,
same-value word and innocent word of outbox_lite/_credentials.py's lists has a case here that
fails when that entry is removed (or loses its kind: strings only, numbers, a map of secrets).

The names are written out by hand, not read from the library: the library's lists are read
only to check that each of their entries has a case (a new entry without one fails)."""

from __future__ import annotations

import pytest

from outbox_lite import CredentialInPayloadError
from outbox_lite import _credentials as guard
from outbox_lite.payload import encode_payload

#: One-word credential keys: a string and a number under each are refused.
WORDS = ["password", "passwd", "pwd", "passphrase", "secret", "token", "authorization",
         "cookie", "credential", "apikey", "privatekey", "secretkey", "accesskey", "sshkey",
         "sessionid", "sessid", "bearer", "jwt", "dsn", "sig"]
#: Plurals: collections of credentials, every key below them refused.
PLURALS = ["passwords", "secrets", "credentials", "cookies", "apikeys", "privatekeys",
           "secretkeys", "accesskeys"]
#: Words that make "<word> key" and "<word> keys" a credential ("master_key").
QUALIFIERS = ["api", "private", "secret", "access", "signing", "encryption", "master",
              "session", "ssh", "ssl", "tls", "hmac", "shared", "account", "deploy", "auth",
              "sas"]
#: Two words that name a credential together, besides the qualifiers' keys.
PAIRS = ["session_id", "auth_header", "connection_string", "conn_str"]
#: One-word keys ending in a credential word: (the ending, a key of it run together).
ENDINGS = [("password", "newpassword"), ("passwd", "dbpasswd"),
           ("passphrase", "gpgpassphrase"), ("secret", "appsecret"), ("token", "csrftoken"),
           ("apikey", "stripeapikey"), ("sessionid", "jsessionid"), ("sessid", "phpsessid")]
#: Trailing words that keep the sense of the words before: "password_<word>" is refused.
SAME_VALUE = ["confirmation", "confirm", "again", "repeat", "retype", "verify", "new", "old",
              "current", "plain", "plaintext", "clear", "cleartext", "raw", "value", "val",
              "b64", "base64", "encoded", "input", "str", "string", "text", "v"]
#: Words before "token" and "pass" that make them ordinary data ("page_token").
INNOCENT_BEFORE = {
    "token": ["page", "pagination", "next", "prev", "previous", "continuation", "cursor", "sync",
              "resume", "max", "min", "num", "total", "eos", "bos", "pad", "unk", "sep", "cls",
              "mask", "stop", "start", "end", "special"],
    "pass": ["boarding", "bus", "day", "season", "hall", "ski", "travel", "transit", "train",
             "rail", "metro", "event", "guest", "visitor", "vip", "press", "backstage", "gym",
             "museum", "park", "parking", "festival", "weekly", "monthly", "annual", "yearly",
             "first", "second", "third", "final", "last", "single", "multi", "render", "test",
             "free"]}

def _refused(payload, path):
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload(payload)
    assert info.value.path == path


@pytest.mark.parametrize("key", WORDS)
def test_a_credential_word_is_refused_as_a_string_and_as_a_number(key):
    _refused({"job": 1, key: "x9"}, f"$.{key}")
    _refused({"job": 1, key: 123456}, f"$.{key}")


@pytest.mark.parametrize("key", PLURALS)
def test_a_plural_refuses_every_key_below_it(key):
    _refused({key: {"prod": "x9"}}, f"$.{key}.prod")
    _refused({key: 123456}, f"$.{key}")


def test_pass_is_refused_as_a_string_only():
    _refused({"pass": "x9"}, "$.pass")
    assert encode_payload({"pass": 3, "fail": 0})  # a test run's count


@pytest.mark.parametrize("qualifier", QUALIFIERS)
def test_a_qualifier_makes_key_and_keys_credentials(qualifier):
    _refused({f"{qualifier}_key": "x9"}, f"$.{qualifier}_key")
    _refused({f"{qualifier}Key": 123456}, f"$.{qualifier}Key")
    _refused({f"{qualifier}_keys": {"prod": "x9"}}, f"$.{qualifier}_keys.prod")
    _refused({f"{qualifier}Keys": 123456}, f"$.{qualifier}Keys")


@pytest.mark.parametrize("key", PAIRS)
def test_a_pair_of_words_is_a_credential(key):
    _refused({key: "x9"}, f"$.{key}")


@pytest.mark.parametrize("ending,key", ENDINGS)
def test_a_credential_word_run_together_with_others_is_refused(ending, key):
    assert key.endswith(ending) and key != ending
    _refused({key: "x9"}, f"$.{key}")


@pytest.mark.parametrize("word", SAME_VALUE)
def test_a_same_value_word_after_a_credential_keeps_it_refused(word):
    _refused({f"password_{word}": "x9"}, f"$.password_{word}")


@pytest.mark.parametrize("key", [f"{before}_{last}" for last, befores in INNOCENT_BEFORE.items()
                                 for before in befores])
def test_an_innocent_word_before_token_or_pass_is_ordinary_data(key):
    assert encode_payload({key: "abc123"}) == f'{{"{key}":"abc123"}}'


def test_every_entry_of_the_librarys_lists_has_a_case_here():
    """A list entry without a case above fails here: add its case (and see it fail without
    the entry)."""
    words = {word: kind for word, kind in guard._CREDENTIAL_WORDS.items()}
    assert words.pop("pass") == guard._STRINGS
    assert {w for w, kind in words.items() if not kind & guard._SUBTREE} <= set(WORDS)
    assert {w for w, kind in words.items() if kind & guard._SUBTREE} <= set(PLURALS)
    assert set(guard._KEY_QUALIFIERS) <= set(QUALIFIERS)
    pairs = {f"{before}_{last}" for last, befores in guard._CREDENTIAL_PAIRS.items()
             for before in befores if last not in ("key", "keys")}
    assert pairs <= set(PAIRS)
    assert set(guard._CREDENTIAL_PAIRS["key"]) | set(guard._CREDENTIAL_PAIRS["keys"]) <= set(
        QUALIFIERS)
    assert set(guard._COMPOUND_ENDINGS) <= {ending for ending, _ in ENDINGS}
    assert set(guard._SAME_VALUE_WORDS) <= set(SAME_VALUE)
    assert set(guard._INNOCENT_BEFORE) <= set(INNOCENT_BEFORE)
    for last, befores in guard._INNOCENT_BEFORE.items():
        assert set(befores) <= set(INNOCENT_BEFORE[last]), last
