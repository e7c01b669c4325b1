"""The shipping consumer's work, whichever broker brings the message: make one shipment per
order, once, however often the message arrives.

The inbox records the message id in the same transaction as the shipment: a redelivered
message (a broker's retry, an event the relay published again, a consumer that died after
its commit and before its ack) finds its id taken and changes nothing.
"""

from __future__ import annotations

from typing import Any

from outbox_lite import Inbox, LockConflictError
from store import Shipment, db

inbox = Inbox(db, "shipping")


def apply(message_id: str, order: dict[str, Any]) -> bool:
    """Ship ``order`` (an ``order.placed`` payload) unless ``message_id`` was handled
    before; True when this call shipped it."""
    while True:
        try:
            with db.atomic():
                if not inbox.accept(message_id):
                    return False  # handled before: nothing to do
                Shipment.create(order_id=order["order_id"], item=order["item"],
                                quantity=order["quantity"])
                return True
        except LockConflictError:
            continue  # the server rolled the transaction back: run it again


def report(message_id: str, order: dict[str, Any], shipped: bool) -> None:
    what = "shipped" if shipped else "skipped (handled before)"
    print(f"order {order['order_id']}: {what} [{message_id}]", flush=True)
