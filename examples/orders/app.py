"""The order service: ``POST /orders`` writes the order and its ``order.placed`` event in one
transaction, so the event exists exactly when the order does.

Run it with ``flask --app examples/orders/app.py run`` (``examples/README.md``).
"""

from __future__ import annotations

from typing import Any

from flask import Flask, jsonify, request

from outbox_lite import OutboxRepository
from store import Order, Shipment, db

outbox = OutboxRepository(db)
app = Flask(__name__)


@app.before_request
def _connect() -> None:
    db.connect(reuse_if_open=True)  # one connection per request, as Peewee's docs do


@app.teardown_request
def _close(exc: BaseException | None) -> None:
    if not db.is_closed():
        db.close()


@app.post("/orders")
def place_order() -> Any:
    body = request.get_json(silent=True) or {}
    customer, item, quantity = body.get("customer"), body.get("item"), body.get("quantity")
    if not (isinstance(customer, str) and customer and isinstance(item, str) and item
            and isinstance(quantity, int) and quantity > 0):
        return jsonify(error="send {\"customer\": str, \"item\": str, \"quantity\": int > 0}"), 400
    # One transaction: the order and its event commit together, or neither does.
    with db.atomic():
        order = Order.create(customer=customer, item=item, quantity=quantity)
        event = outbox.create_in_transaction(
            event_type="order.placed", aggregate_type="order", aggregate_id=str(order.id),
            payload={"order_id": order.id, "customer": customer, "item": item,
                     "quantity": quantity})
        # No dedupe_key: a random one, so the message id is new even after the database is
        # reset and order ids start again at 1 (the brokers remember ids they have seen).
    return jsonify(id=order.id, event_id=event.id), 201


@app.get("/orders/<int:order_id>")
def show_order(order_id: int) -> Any:
    order = Order.get_or_none(Order.id == order_id)
    if order is None:
        return jsonify(error=f"no order {order_id}"), 404
    shipped = Shipment.select().where(Shipment.order_id == order_id).count()
    return jsonify(id=order.id, customer=order.customer, item=order.item,
                   quantity=order.quantity, shipments=shipped)
