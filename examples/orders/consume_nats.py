"""The shipping consumer on NATS JetStream: creates the stream that captures
``<ORDERS_TOPIC>.>`` when there is none (so the relay finds it on a fresh server), then reads
it with a durable pull consumer, acking each message once the shipment has committed. The
message id is the ``Nats-Msg-Id`` header; the body the payload as JSON. Ctrl-C or SIGTERM stop
it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import nats
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

import shipping

URL = os.environ.get("OUTBOX_NATS_URL", "nats://127.0.0.1:4222")
PREFIX = os.environ.get("ORDERS_TOPIC", "orders")
STREAM = PREFIX.upper().replace(".", "_")


async def main() -> None:
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    client = await nats.connect(URL)
    js = client.jetstream()
    try:
        await js.stream_info(STREAM)
    except NotFoundError:
        await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{PREFIX}.>"]))
    sub = await js.pull_subscribe(f"{PREFIX}.order.placed", durable="shipping",
                                  stream=STREAM)
    print(f"shipping: consuming JetStream stream {STREAM}", flush=True)
    while not stop.is_set():
        try:
            messages = await sub.fetch(10, timeout=0.5)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            continue
        for msg in messages:
            message_id = (msg.headers or {})["Nats-Msg-Id"]  # the relay sets it on each
            order = json.loads(msg.data)
            shipped = await asyncio.to_thread(shipping.apply, message_id, order)
            shipping.report(message_id, order, shipped)
            await msg.ack()  # only after the commit
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
