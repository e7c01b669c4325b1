"""The credential guard, tested like a library: a table of credential shapes that must be refused
(as payload values, as object keys, and masked by redact() in free text) and of look-alikes,
ordinary business data, that must pass untouched."""

from __future__ import annotations

import base64
import random

import pytest

from outbox_lite import CredentialInPayloadError, OutboxRepository, PayloadError
from outbox_lite._credentials import redact
from outbox_lite.payload import encode_payload

from _helpers import new_event

# Built at run time so that no scanner mistakes this test table for leaked secrets.
GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = ("eyJhbGciOiJIUzI1NiJ9" + "." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" + "."
       + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----"
SLACK_HOOK = "T00000000/B00000000/" + "XXXXXXXXXXXXXXXXXXXXXXXX"
DISCORD_HOOK = "123456789012345678/" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcd"


def _rows(category, rows):
    """Table rows with ids that name their category (the issue's items are categories)."""
    return [pytest.param(*(row if isinstance(row, tuple) else (row,)), id=f"{category}-{n}")
            for n, row in enumerate(rows, 1)]


# ---------------------------------------------------------------------------
# Credentials known by their key name: (payload, JSON path named in the error)
# ---------------------------------------------------------------------------

KEY_SECRETS = _rows("key", [
    ({"password": "hunter2"}, "$.password"),
    ({"db_password": "x9"}, "$.db_password"),
    ({"userPassword": "x9"}, "$.userPassword"),
    ({"passwd": "x9"}, "$.passwd"),
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
    ({"tokens_list": ["ok"], "api_keys": ["k1", "k2"]}, "$.api_keys[0]"),
    ([{"ok": 1}, {"token": "t"}], "$[1].token"),
    ({"secret": 42}, "$.secret"),
    ({"auth_token": "t"}, "$.auth_token"),
    ({"sessionToken": "t"}, "$.sessionToken"),
    ({"id_token": "t"}, "$.id_token"),
    ({"bearer_token": "t"}, "$.bearer_token"),
    ({"jwt": "j"}, "$.jwt"),
    ({"dsn": "d"}, "$.dsn"),
    ({"connection_string": "c"}, "$.connection_string"),
    ({"signing_key": "k"}, "$.signing_key"),
    ({"encryption_key": "k"}, "$.encryption_key"),
    ({"hmac_key": "k"}, "$.hmac_key"),
    ({"webhook_secret": "w"}, "$.webhook_secret"),
    ({"MYSQL_ROOT_PASSWORD": "r"}, "$.MYSQL_ROOT_PASSWORD"),
    ({"AWS_SECRET_ACCESS_KEY": "k"}, "$.AWS_SECRET_ACCESS_KEY"),
    ({"KEY_PASSWORD": "k"}, "$.KEY_PASSWORD"),
    ({"sig": "abc"}, "$.sig"),
    ({"csrftoken": "c"}, "$.csrftoken"),
    ({"DB_PASS": "p"}, "$.DB_PASS"),
    ({"smtpPass": "p"}, "$.smtpPass"),
    ({"pass": "x9"}, "$.pass"),
    ({"user_pass": "x9"}, "$.user_pass"),
    # Missed key names (issue 7.1): a digit or a same-value word after the credential word,
    # credential words run together, a map of secrets, an ssh key that is not PEM.
    ({"password1": "x9"}, "$.password1"),
    ({"password2": "x9"}, "$.password2"),
    ({"password_confirmation": "x9"}, "$.password_confirmation"),
    ({"passwordConfirmation": "x9"}, "$.passwordConfirmation"),
    ({"password_new": "x9"}, "$.password_new"),
    ({"new_password": "x9"}, "$.new_password"),
    ({"newpassword": "x9"}, "$.newpassword"),
    ({"NEWPASSWORD": "x9"}, "$.NEWPASSWORD"),
    ({"PGPASSWORD": "x9"}, "$.PGPASSWORD"),
    ({"clientsecret": "x9"}, "$.clientsecret"),
    ({"token_v2": "t"}, "$.token_v2"),
    ({"api_key_2": "k"}, "$.api_key_2"),
    ({"secret_value": "s"}, "$.secret_value"),
    ({"password": {"new": "x9", "confirmation": "x9"}}, "$.password.new"),
    ({"secrets": {"db": "x9"}}, "$.secrets.db"),
    ({"secrets": {"prod": {"db": {"pw": "x9"}}}}, "$.secrets.prod.db.pw"),
    ({"passwords": ["a1"]}, "$.passwords[0]"),
    ({"apiKeys": {"stripe": "k"}}, "$.apiKeys.stripe"),
    ({"credentials": {"user": "bob", "pass": "x9"}}, "$.credentials.user"),
    ({"ssh_key": "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"}, "$.ssh_key"),
    ({"sshKey": "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"}, "$.sshKey"),
    ({"ssh_private_key": "b3BlbnNzaC1rZXktdjEAAAAA"}, "$.ssh_private_key"),
    ({"deploy_key": "k"}, "$.deploy_key"),
    # Header name/value pairs as objects or as a list of 2-lists (issue 7.1).
    ({"headers": [{"name": "X-Api-Key", "value": "k-123"}]}, "$.headers[0].value"),
    ({"headers": [{"name": "Authorization", "value": "Token abc"}]}, "$.headers[0].value"),
    ({"header": {"key": "api_key", "value": "x"}}, "$.header.value"),
    ({"Tags": [{"Key": "password", "Value": "x9"}]}, "$.Tags[0].Value"),
    ({"env": [{"name": "DB_PASSWORD", "value": "x9"}]}, "$.env[0].value"),
    ({"headers": [["Accept", "json"], ["X-Api-Key", "k-123"]]}, "$.headers[1][1]"),
    ({"headers": [("Cookie", "sid=1")]}, "$.headers[0][1]"),
    ({"h": [["Authorization", "Token abc"]]}, "$.h[0][1]"),
    ({"params": [["password", 1234]]}, "$.params[0][1]"),
])

# ---------------------------------------------------------------------------
# Credentials known by their shape in free text: (text, the secret, or several)
# Each is refused as a payload value and as an object key, and masked by redact().
# ---------------------------------------------------------------------------

TEXT_SECRETS = (
    _rows("shape", [
        ("Authorization: Bearer abcdef0123456789ghijKLMN", "abcdef0123456789ghijKLMN"),
        ("Bearer\tabcdef0123456789ghijKLMN", "abcdef0123456789ghijKLMN"),
        ("h: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        (PEM, "MIIEowIBAAKCAQEA7"),
        ("-----BEGIN EC " + "PRIVATE KEY-----\nMHcCAQEEIBkg4LVW\n-----END EC PRIVATE KEY-----",
         "MHcCAQEEIBkg4LVW"),
        ("-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH "
         "PRIVATE KEY-----", "b3BlbnNzaC1rZXk"),
        ("-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\n\nlQOYBF0pGpgBCAC\n-----END PGP PRIVATE "
         "KEY BLOCK-----", "lQOYBF0pGpgBCAC"),
        (JWT, JWT),
        ("session " + JWT + " expired", JWT),
        (AWS, AWS),
        ("ASIA" + "Y34FZKBOKMUTVV7A", "ASIA" + "Y34FZKBOKMUTVV7A"),
        (GH, GH),
        ("gho_" + "16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a"),
        ("github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop", "11ABCDEFG0123456789_abcdefghij"),
        ("xoxb-" + "123456789012-abcdefABCDEF", "123456789012-abcdefABCDEF"),
        ("xoxp-" + "1234-5678-90ab-cdef12345678", "1234-5678-90ab-cdef12345678"),
        ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("rk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("sk-proj-" + "abcDEF123ghiJKL456mnoPQR789", "abcDEF123ghiJKL456mnoPQR789"),
        ("AIza" + "SyA1234567890abcdefghijklmnopqrstuv", "SyA1234567890abcdefghijklmnopqrstuv"),
        ("glpat-" + "xxxxxxxxxxxx1234abcd", "xxxxxxxxxxxx1234abcd"),
        ("npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
        ("SG." + "ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
         "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr"),
        ("postgres://app:s3cr3t@db:5432/app", "s3cr3t"),
        ("https://user:pa55@example.com/hook", "pa55"),
        ("redis://:sekret@cache:6379/0", "sekret"),
        ("amqp://guest:guestpw1@rabbit/", "guestpw1"),
        ("mongodb+srv://user:p%40ss@cluster0.example.net/db", "p%40ss"),
        ("Server=db;User Id=app;Password=Pa55w0rd;", "Pa55w0rd"),
        ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "a1" * 15 + "==",
         "a1" * 15),
        ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey="
         + "c2VjcmV0a2V5" * 3, "c2VjcmV0a2V5" * 3),
        ("login password=hunter2 rejected", "hunter2"),
        ("GET /cb?token=abc123def&x=1", "abc123def"),
        ("pwd=abc1", "abc1"),
        ("secret=xyz987", "xyz987"),
        ("api_key=abc123xyz", "abc123xyz"),
        ("apikey=abc123xyz", "abc123xyz"),
        ("client_secret=s3cr3tv4lue", "s3cr3tv4lue"),
        ("mysql --password=hunter2x -h db", "hunter2x"),
        ("$password = 'php-secret'", "php-secret"),
        ("'password' => 'arrowpw'", "arrowpw"),
    ])
    # The credential word after "_" in NAME=value (issue 7.1).
    + _rows("underscore", [
        ("KEY_PASSWORD=Tr0ub4dor", "Tr0ub4dor"),
        ("AWS_SECRET_ACCESS_KEY=" + AWS_SECRET, AWS_SECRET),
        ("DB_PASSWORD=swordfish", "swordfish"),
        ("export MYSQL_ROOT_PASSWORD=rootpw42", "rootpw42"),
        ("REDIS_PASS=r3dispass", "r3dispass"),
        ("APP_SECRET=appsecret9", "appsecret9"),
        ("GITHUB_TOKEN=ghtoken123", "ghtoken123"),
        ("STRIPE_API_KEY=stripe123key", "stripe123key"),
        ("PGPASSWORD=pgpass99 psql -h db", "pgpass99"),
        ("SMTP_PASSWORD='mail pass 7'", "mail pass 7"),
        ('DJANGO_SECRET_KEY="dj4ng0-s3cret"', "dj4ng0-s3cret"),
        ("env: NEW_PASSWORD=newpw-2026 OLD_PASSWORD=oldpw-2025", ("newpw-2026", "oldpw-2025")),
    ])
    # "name: value", colon and space, YAML and log style (issue 7.1).
    + _rows("colon", [
        ("password: swordfish", "swordfish"),
        ("db:\n  host: db\n  password: swordfish2\n", "swordfish2"),
        ("login failed, password: hunter22", "hunter22"),
        ("- password: yamlpass", "yamlpass"),
        ("Password: S3cret!", "S3cret!"),
        ("token: abc123def", "abc123def"),
        ("api_key: 12345abcde", "12345abcde"),
        ("client_secret: xyzXYZ123", "xyzXYZ123"),
        ("ERROR: password: tiger", "tiger"),
        ("passwd:\thunter3", "hunter3"),
        ("user bob; password: plainword", "plainword"),
        ("API key: a1b2c3d4e5", "a1b2c3d4e5"),
        ("Your API key: a1b2c3d4e5 (keep it safe)", "a1b2c3d4e5"),
        ("Secret Access Key: " + AWS_SECRET, AWS_SECRET),
        ("X-Auth-Token: abc123def", "abc123def"),
        ("password:hunter2", "hunter2"),
    ])
    # JSON (or a Python repr) inside a string (issue 7.1).
    + _rows("json-in-string", [
        ('{"password": "hunter2"}', "hunter2"),
        ('{"user":"bob","password":"correct horse"}', "correct horse"),
        ("{'password': 'swordfish'}", "swordfish"),
        ('{\\"password\\": \\"escaped1\\"}', "escaped1"),
        ('{"api_key":"k-123456"}', "k-123456"),
        ('{"Authorization": "Bearer short"}', "Bearer short"),
        ('[{"name":"db","secret":"inner-s3"}]', "inner-s3"),
        ('config={"token": "tok-inner-1"}', "tok-inner-1"),
    ])
    # Secrets in a URL's query (issue 7.1).
    + _rows("query", [
        ("https://api.example.com/v1/me?access_token=abc123def456", "abc123def456"),
        ("https://acct.blob.core.windows.net/c/b.txt?sv=2021-08-06&se=2026-01-01&sr=b&sp=r"
         "&sig=AbCdEf%2BgHiJkL%3D", "AbCdEf%2BgHiJkL%3D"),
        ("https://x.example.com/login?user=bob&password=swordfish3", "swordfish3"),
        ("/v1/search?api_key=abc123&q=1", "abc123"),
        ("https://oauth.example.com/t?client_id=app&client_secret=s3cr3tv4l", "s3cr3tv4l"),
        ("wss://stream.example.com/?auth_token=ws-tok-123", "ws-tok-123"),
    ])
    # Authorization header lines with any scheme (issue 7.1).
    + _rows("authorization", [
        ("Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b",
         "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"),
        ("authorization: Bot MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ",
         "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ"),
        ("Proxy-Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
        ("Authorization: ApiKey abc123def", "abc123def"),
        ("request had Authorization: token plainpassword", "plainpassword"),
        ("Authorization: sk-live-abc123", "sk-live-abc123"),
    ])
    # Cookie and Set-Cookie header lines (issue 7.1).
    + _rows("cookie", [
        ("Cookie: sessionid=abc123xyz; csrftoken=xyz789abc", ("abc123xyz", "xyz789abc")),
        ("Set-Cookie: sid=31d4d96e407aad42; Path=/; Secure; HttpOnly", "31d4d96e407aad42"),
        ("GET / HTTP/1.1\r\nHost: example.com\r\nCookie: session=s3ss10n\r\n", "s3ss10n"),
        ("set-cookie: remember_token=rem3mb3r; Expires=Wed", "rem3mb3r"),
    ])
    # A password given to the mysql client as -p<password> (issue 7.1).
    + _rows("mysql-p", [
        ("mysql -u root -pS3cretPw app", "S3cretPw"),
        ("mysqldump -uroot -p'hunter 2' shop", "hunter 2"),
        ("mariadb -h db -u app -pHunter2x shop", "Hunter2x"),
        ("sh -c 'mysql -uapp -pmysqlpw9 -e \"select 1\"'", "mysqlpw9"),
    ])
    # A URL whose password holds "/" or "@" (issue 7.1).
    + _rows("dsn", [
        ("postgres://app:pa/ss@db/app", "pa/ss"),
        ("mysql://root:p@ss@db:3306/app", "p@ss"),
        ("amqp://guest:g/u@st@rabbit:5672/", "g/u@st"),
        ("connect to mysql://root:pw/with@at@db.internal failed", "pw/with@at"),
    ])
    # Webhook URLs whose path is the credential (issue 7.1).
    + _rows("webhook", [
        ("https://hooks.slack.com/services/" + SLACK_HOOK, SLACK_HOOK),
        ("https://hooks.slack.com/workflows/T0000/A0000/123456/" + "abcdefABCDEF123",
         "abcdefABCDEF123"),
        ("https://discord.com/api/webhooks/" + DISCORD_HOOK, DISCORD_HOOK),
        ("posting to https://discordapp.com/api/webhooks/" + DISCORD_HOOK + " failed",
         DISCORD_HOOK),
    ])
    # A bare AWS secret key next to its key id (issue 7.1).
    + _rows("aws-pair", [
        (AWS + " " + AWS_SECRET, (AWS, AWS_SECRET)),
        ("key " + AWS + " secret " + AWS_SECRET, (AWS, AWS_SECRET)),
        (AWS + ":" + AWS_SECRET, (AWS, AWS_SECRET)),
        (AWS_SECRET + "," + AWS, (AWS, AWS_SECRET)),
        ('["' + AWS + '", "' + AWS_SECRET + '"]', (AWS, AWS_SECRET)),
    ])
)

# ---------------------------------------------------------------------------
# Look-alikes: ordinary business data that must pass
# ---------------------------------------------------------------------------

_rng = random.Random(7)
IMAGE = "data:image/png;base64," + base64.b64encode(_rng.randbytes(30_000)).decode()

LOOK_ALIKE_PAYLOADS = _rows("payload", [
    {"tokenCount": 1200},
    {"max_tokens": 512, "prompt_tokens": 100, "completion_tokens": 20},
    {"usage": {"tokens": 512, "total_tokens": 1024}},
    {"passwordChangedAt": "2026-01-01T00:00:00Z"},
    {"password_set": True},
    {"password_policy": {"min_length": 12, "require_digit": True}},
    {"password_expires_at": "2026-05-01", "token_expires_in": 3600},
    {"password_reset_required": False},
    {"test": "lint", "pass": True, "bypass_cache": "yes"},
    {"results": {"pass": 12, "fail": 0}},
    {"password": None},
    {"password": ""},
    {"password": "***"},
    {"env": [{"name": "DB_PASSWORD", "value": "${DB_PASSWORD}"}]},
    {"env": [{"name": "DB_PASSWORD",
              "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]},
    {"secret_name": "prod/db"},
    {"secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbCdEf"},
    {"secret": {"name": "db", "version": "v3"}},
    {"token": {"type": "bearer", "expires_in": 3600}},
    {"token_type": "Bearer"},
    {"next_page_token": "CAESBggDEAEYAQ", "pagination_token": "eyxyz123"},
    {"nextToken": "AAMA-EFRSURBSGh4", "continuationToken": "+RID:~abc==#RT:1"},
    {"eos_token": "</s>", "pad_token": "<pad>", "max_token": 128},
    {"boarding_pass": {"seat": "12A", "gate": "B7", "barcode": "M1DOE/JOHN EABC123"}},
    {"boarding_pass": "M1DOE/JOHN EABC123 LHRJFK"},
    {"season_pass": "SP-2026-0042", "ski_pass": "SKI-991"},
    {"key": "colour"},
    {"keys": ["a", "b"]},
    {"primary_key": "id", "sort_key": "created_at", "partition_key": "tenant"},
    {"keyboard_layout": "de", "monkey": "bonobo"},
    {"author": "user@example.com", "site": "https://example.com/path?q=1"},
    {"authorized": False, "author": "Ann"},
    {"authentication_method": "oauth", "auth_method": "saml", "auth": "sso"},
    {"access_key_id_rotated": True},
    {"aws_region": "eu-west-1", "bucket": "reports"},
    {"sha": "3f786850e387550fdab836ed7e6dc881de23001b"},
    {"sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
    {"uuid": "123e4567-e89b-12d3-a456-426614174000"},
    {"order_id": "ORD-2026-000123", "sku": "AB-1234-XY", "amount": 1999},
    {"cookie_consent": True, "cookie_policy": "strict"},
    {"session": {"started_at": "2026-01-01T10:00:00Z", "pages": 3}, "session_count": 4},
    {"signature_required": True, "design": "modern", "signal": 3},
    {"grant_type": "password", "username": "bob"},
    {"fields": ["password", "email"]},
    {"changed": ["password", "email"]},
    {"form": [{"name": "password", "type": "password", "required": True}]},
    {"headers": [{"name": "Accept", "value": "application/json"}]},
    {"headers": [["Accept", "json"], ["Content-Type", "text/plain"]]},
    {"pair": ["token_type", "Bearer"]},
    {"metric": {"name": "latency", "value": 12.5}},
    {"tags": [{"Key": "Name", "Value": "web-1"}]},
    {"passenger": "Ann Lee", "passport_country": "NZ", "compass": "N"},
    {"image": IMAGE},
    {"n": 1.5, "list": [1, 2, 3], "empty": {}, "nested": [[[]]]},
    {"dedupe_key": "order-123", "idempotency_key": "a1b2c3"},
    {"vault_path": "secret/data/prod/db", "secret_ref": {"name": "db", "key": "password"}},
    {"url": "https://example.com:8443/a/b?page=2&sort=asc#top"},
    {"sessions": [{"id": 1}, {"id": 2}]},
    {"tokenizer": "cl100k_base", "token_ids": [1, 2, 3]},
])

LOOK_ALIKE_TEXTS = _rows("text", [
    "Please reset your password: click the link we sent.",
    "The bearer of this letter is a friend.",
    "basic understanding of the secret garden",
    "scikit-learn sk-learn-is-a-machine-learning-library",
    "Accept: application/json",
    "Configure auth=oauth in settings",
    "refresh token:expired",
    "Our secret:recipe",
    "Your password: Expired",
    "The secret: patience.",
    "Passwords must be 12 characters or more: letters, digits",
    "password reset requested at 12:30",
    "api_key rotation scheduled for 2026-01-01",
    "tokens: 512",
    "max_tokens=512",
    "token_count=3",
    "page_token=abc123&next_token=def456",
    "sort_key=created_at",
    "primary_key: id",
    "author: Ann",
    "session: 42",
    "secret_name=prod/db",
    "grant_type=password&username=bob",
    "cookie: chocolate chip",
    "Time: 12:30, ratio 16:9",
    "Tests pass: 12 fail: 0",
    "password: ********",
    "password=${DB_PASSWORD}",
    "password: <your password>",
    "token=",
    "FATAL: password authentication failed for user \"app\"",
    "Access denied for user 'app'@'10.0.0.5' (using password: YES)",
    "Access denied for user 'root'@'localhost' (using password: NO)",
    "if token == expected: return",
    "Authorization: denied",
    "Authorization header missing",
    "https://example.com:8443/path",
    "https://medium.com/@user/post-1",
    "https://host:8080/@user",
    "mailto:ann@example.com",
    "ssh://git@github.com/org/repo.git",
    "git@github.com:org/repo.git",
    "postgres://db.internal:5432/app",
    "redis://cache:6379/0",
    "s3://bucket/reports/2026/01.csv",
    "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbCdEf",
    "arn:aws:iam::123456789012:role/token-refresher",
    "mkdir -p /tmp/x && ssh -p 2222 host",
    "docker run -p8080:80 image",
    "mysql -h db -u app -p app",
    "mysql -P3306 -h db -u app",
    "3f786850e387550fdab836ed7e6dc881de23001b",
    "123e4567-e89b-12d3-a456-426614174000",
    "key=value pairs are separated by &",
    "design: modern, signal: 5",
    "The key is under the mat.",
    "Primary key: order_id",
    "The key: under the mat",
    "X-Request-Id: 4f9c2a71-0c1d-4d3e-9b1a-6f2e8c7d5a10",
    "user=ann action=login result=ok session=42",
    "token expired at 2026-01-01T00:00:00Z",
    "Bearer tokens are described in RFC 6750",
    "password123 is a weak password",
    "passed: 12, failed: 0",
    "boarding_pass=BP-12345",
    "continuationToken=abc123",
    "broker at amqp://broker:5672 refused the connection (timeout after 30 s)",
    "See https://docs.example.com/auth?section=tokens#refresh",
    "Dear Ann, your order ORD-2026-000123 has shipped.",
    AWS_SECRET,
    "principalId AROA" + "ABCDEFGHIJ123456:alice assumed role",  # a role's unique id
])


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

def _secrets(secret):
    return secret if isinstance(secret, tuple) else (secret,)


def _error_text(error):
    return " ".join([str(error), error.path, repr(error), repr(error.args)])


@pytest.mark.parametrize("payload,path", KEY_SECRETS)
def test_credential_keys_are_refused_with_their_path(payload, path):
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload(payload)
    assert info.value.path == path
    assert path in str(info.value)


@pytest.mark.parametrize("text,secret", TEXT_SECRETS)
def test_credential_values_are_refused_without_echoing_them(text, secret):
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload({"job": 1, "note": text})
    assert info.value.path == "$.note"
    for part in _secrets(secret):
        assert part not in _error_text(info.value)


@pytest.mark.parametrize("text,secret", TEXT_SECRETS)
def test_a_credential_used_as_a_key_is_masked_in_the_path(text, secret):
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload({"pools": {"main": {"size": 1}, text: {"size": 5}}})
    assert info.value.path == "$.pools[<redacted key>]"
    assert "$.pools[<redacted key>]" in str(info.value)
    for part in _secrets(secret):
        assert part not in _error_text(info.value)


@pytest.mark.parametrize("text,secret", TEXT_SECRETS)
def test_redact_masks_every_shape_the_guard_refuses(text, secret):
    masked = redact(text)
    assert "***" in masked
    for part in _secrets(secret):
        assert part not in masked


@pytest.mark.parametrize("payload", LOOK_ALIKE_PAYLOADS)
def test_ordinary_data_passes(payload):
    assert encode_payload(payload)


@pytest.mark.parametrize("text", LOOK_ALIKE_TEXTS)
def test_ordinary_text_passes_as_a_value_and_a_key_and_redact_leaves_it(text):
    assert encode_payload({"note": text})
    assert encode_payload({"notes": {text: True}})
    assert redact(text) == text


def test_the_table_is_as_large_as_promised():
    secrets = len(KEY_SECRETS) + len(TEXT_SECRETS)
    look_alikes = len(LOOK_ALIKE_PAYLOADS) + len(LOOK_ALIKE_TEXTS)
    assert secrets >= 150 and look_alikes >= 100, (secrets, look_alikes)


def test_every_sensitive_name_gets_past_the_first_look():
    """The cheap first look (anchors, triggers) must let through every name the rules know."""
    from outbox_lite import _credentials as guard
    names = [*guard._CREDENTIAL_WORDS,
             *(f"{before}_{last}" for last, befores in guard._CREDENTIAL_PAIRS.items()
               for before in befores),
             *(f"my{ending}" for ending in guard._COMPOUND_ENDINGS)]
    for name in names:
        for text in (f"{name}=Abc123", f"x {name.upper()}: Abc123", f"{{'{name}': 'abc'}}",
                     f'{{"{name}": "abc"}}'):
            assert redact(text) != text, text
            with pytest.raises(CredentialInPayloadError):
                encode_payload({"m": text})


def test_a_refused_key_is_masked_and_the_rest_of_the_path_stays_readable():
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload({"pools": {"postgres://app:pw@db/app": {"size": 5}}})
    assert info.value.path == "$.pools[<redacted key>]"
    assert "pw@db" not in str(info.value)
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload({"a": [{"b c": {JWT: 1}}]})
    assert info.value.path == '$.a[0]["b c"][<redacted key>]'
    with pytest.raises(CredentialInPayloadError) as info:
        encode_payload([{"password=hunter2": {"x": float("nan")}}])  # the key comes first
    assert info.value.path == "$[0][<redacted key>]" and "hunter2" not in str(info.value)


def test_a_service_can_allow_a_key_it_knows_is_safe(db, clock, fetch):
    repo = OutboxRepository(db, clock=clock, allowed_payload_keys=["idempotency_token"])
    with db.atomic():
        repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                   payload={"idempotencyToken": "public-123"})
        repo.create_in_transaction(
            event_type="e", aggregate_type="a", aggregate_id="3",
            payload={"headers": [["Idempotency-Token", "public-456"]]})
        with pytest.raises(CredentialInPayloadError):
            repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="2",
                                       payload={"token": "t", "idempotency_token": "x"})
    assert fetch("SELECT aggregate_id FROM outbox_event ORDER BY id") == [
        {"aggregate_id": "1"}, {"aggregate_id": "3"}]


def test_a_refused_payload_writes_nothing(db, clock, fetch):
    repo = OutboxRepository(db, clock=clock)
    with db.atomic():
        for payload in ({"n": "KEY_PASSWORD=Tr0ub4dor"}, {"p": {"mysql://a:b/c@db/x": 1}}):
            with pytest.raises(CredentialInPayloadError):
                repo.create_in_transaction(event_type="e", aggregate_type="a",
                                           aggregate_id="1", payload=payload)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


def test_credential_error_is_a_payload_error_and_a_value_error():
    with pytest.raises(PayloadError):
        encode_payload({"password": "x"})
    with pytest.raises(ValueError):
        encode_payload({"password": "x"})


def test_mark_failed_stores_every_shape_masked(repo, fetch):
    texts = [param.values for param in TEXT_SECRETS]
    ids = []
    for n, (text, _) in enumerate(texts):
        event = new_event(repo, n)
        assert repo.mark_processing(event.id, "w1")
        message = f"publish failed: {text}\n(attempt 1)"
        assert repo.mark_failed(event.id, "w1", "publish_error", message)
        ids.append(event.id)
    stored = {row["id"]: row["m"] for row in fetch(
        "SELECT id, last_error_message AS m FROM outbox_event")}
    for event_id, (text, secret) in zip(ids, texts):
        assert stored[event_id].startswith("publish failed: ")
        for part in _secrets(secret):
            assert part not in stored[event_id], text


@pytest.mark.parametrize("text,kept", [
    ("connect mysql://app:s3cr3t@db/app failed", "connect mysql://app:***@db/app failed"),
    ("401 for Bearer abcdEFGH1234ijklMNOP5678", "401 for Bearer ***"),
    ("login password=hunter2 rejected", "login password=*** rejected"),
    ("GET /cb?token=abc123def&x=1", "GET /cb?token=***&x=1"),
    ("jwt " + JWT + " expired", "jwt *** expired"),
    ("key " + AWS + " denied", "key *** denied"),
    (PEM, "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"),
    ("Authorization: Token abc123def", "Authorization: Token ***"),
    ('{"user": "bob", "password": "hunter2"}', '{"user": "bob", "password": "***"}'),
    ("Set-Cookie: sid=31d4d96e407aad42; Path=/", "Set-Cookie: ***"),
    ("mysql -uroot -pS3cretPw app", "mysql -uroot -p*** app"),
    ("postgres://app:p@ss@db/app", "postgres://app:***@db/app"),
    ("a " + AWS + " " + AWS_SECRET + " b", "a *** *** b"),
])
def test_redact_keeps_the_text_around_the_secret(text, kept):
    assert redact(text) == kept


@pytest.mark.parametrize("make", [
    lambda n: "a:" * n, lambda n: "://" * n, lambda n: "a=" * n, lambda n: "password" * n,
    lambda n: "password=" * n, lambda n: "password:" * n, lambda n: "-p" * n,
    lambda n: "@" * n, lambda n: "a" * n, lambda n: "eyJ" * n, lambda n: "Authorization: " * n,
    lambda n: "https://a:" * n, lambda n: "mysql " + "x" * n, lambda n: "x://a:b" + "@a" * n,
    lambda n: AWS + " " + "A" * n, lambda n: " " * n + "password: x",
    lambda n: "-----BEGIN RSA PRIVATE KEY-----" + "a " * n, lambda n: "a-" * n,
    lambda n: "secret: " + "a" * n + " " + "secret: " + "b" * n,
], ids=lambda make: make(1)[:24])
def test_adversarial_text_is_scanned_to_its_end(make):
    """Long, repetitive input must not make a rule backtrack: the scan reaches the end."""
    text = make(50_000)[:100_000] + " password=hunter2x"
    assert "hunter2x" not in redact(text)
    with pytest.raises(CredentialInPayloadError):
        encode_payload({"m": text})
