"""The shipping consumer on RabbitMQ: declares its exchange, a durable queue and the binding
(so the relay finds the exchange on a fresh broker), then acks each message once the
shipment has committed. The message id is the event's; the body its payload as JSON.
Ctrl-C or SIGTERM stop it.
"""

from __future__ import annotations

import json
import os
import signal

import pika

import shipping

URL = os.environ.get("OUTBOX_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
EXCHANGE = os.environ.get("ORDERS_TOPIC", "orders")
QUEUE = f"{EXCHANGE}.shipping"


def main() -> None:
    stopping: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: stopping.append(signum))
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.exchange_declare(EXCHANGE, "topic", durable=True)
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_bind(QUEUE, EXCHANGE, routing_key="order.placed")
    channel.basic_qos(prefetch_count=10)
    print(f"shipping: consuming RabbitMQ queue {QUEUE}", flush=True)
    for method, properties, body in channel.consume(QUEUE, inactivity_timeout=0.5):
        if method is None:  # quiet for a moment: a chance to stop
            if stopping:
                break
            continue
        order = json.loads(body)
        shipping.report(properties.message_id, order,
                        shipping.apply(properties.message_id, order))
        channel.basic_ack(method.delivery_tag)  # only after the commit
    channel.cancel()
    connection.close()


if __name__ == "__main__":
    main()
