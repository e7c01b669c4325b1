"""The order service's database: the Peewee database both the web app and the consumers use,
and their two tables (an order, and the shipment the shipping consumer makes of it).

One setting, ``OUTBOX_DATABASE_URL`` (the variable ``outbox-lite migrate`` and ``outbox-lite
relay`` read too), names the database; ``outbox-lite migrate`` has made its ``outbox_event``
and ``inbox_message`` tables; ``python examples/orders/store.py`` makes the service's own, once,
before the app and the consumers start (each making them at its start would race: two
``CREATE INDEX`` of one name).
"""

from __future__ import annotations

import datetime as dt
import os

import peewee
from playhouse.db_url import connect

DATABASE_URL = os.environ.get("OUTBOX_DATABASE_URL", "mysql://root@127.0.0.1:3306/orders")

# MySQL and MariaDB: utf8mb4, so every character is stored as sent (Peewee 3's default, utf8,
# is refused by outbox_lite: it would store an emoji as '?'). PostgreSQL (postgresql://): the
# database's encoding is UTF8 as outbox-lite migrate creates it, nothing to add.
CONNECTION_OPTIONS = {"mysql": {"charset": "utf8mb4"}}
db = connect(DATABASE_URL, **CONNECTION_OPTIONS.get(DATABASE_URL.partition("://")[0], {}))


class Order(peewee.Model):
    id = peewee.AutoField()
    customer = peewee.CharField(max_length=100)
    item = peewee.CharField(max_length=100)
    quantity = peewee.IntegerField()
    created_at = peewee.DateTimeField(default=lambda: dt.datetime.now(dt.timezone.utc))

    class Meta:
        database = db
        table_name = "orders"


class Shipment(peewee.Model):
    """What the shipping consumer makes of an order: one row per order, kept to one by the
    inbox (no unique key here, so that the inbox alone is what keeps it to one)."""

    order_id = peewee.BigIntegerField(index=True)
    item = peewee.CharField(max_length=100)
    quantity = peewee.IntegerField()

    class Meta:
        database = db
        table_name = "shipment"


def create_tables() -> None:
    with db.connection_context():
        db.create_tables([Order, Shipment], safe=True)


if __name__ == "__main__":
    create_tables()
    print(f"tables orders and shipment are in database {db.database}")
