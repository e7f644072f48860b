"""nats-py's push consumers with acks, unmodified, against a running Canopy server:
what its documentation's `js.subscribe` examples do. An ephemeral subscription over a
stream gets what is stored, then what comes, and acks each; a durable one with a
callback; a nak'd message comes again, an unacked one after ack_wait; the consumer's
info counts what is waiting for acks; a queue of subscribers (deliver_group) shares
the messages.

Usage: python nats_py_push.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS.
"""
import asyncio

import nats
from nats.js.api import ConsumerConfig

from checks_main import run

TIMEOUT = 5


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-push")
    js = nc.jetstream(timeout=TIMEOUT)
    await js.add_stream(name="EV", subjects=["ev.>"])
    for i in range(3):
        await js.publish(f"ev.{i}", f"stored {i}".encode())

    # Ephemeral: js.subscribe finds the stream by subject and makes the consumer.
    sub = await js.subscribe("ev.>")
    got = []
    for _ in range(3):
        msg = await sub.next_msg(timeout=TIMEOUT)
        got.append((msg.subject, msg.data))
        assert msg.metadata.stream == "EV", msg.metadata
        await msg.ack()
    # In order per subject, as a pull consumer's (three subjects: any order).
    assert sorted(got) == [(f"ev.{i}", f"stored {i}".encode()) for i in range(3)], got
    await js.publish("ev.live", b"live")
    msg = await sub.next_msg(timeout=TIMEOUT)
    assert msg.data == b"live", msg
    await msg.ack_sync()
    info = await sub.consumer_info()
    assert info.num_ack_pending == 0, info
    assert info.config.deliver_subject, info.config
    await sub.unsubscribe()

    # Durable, with a callback: a nak'd message comes again, with its count.
    seen = asyncio.Queue()

    async def handler(msg):
        await seen.put((msg.data, msg.metadata.num_delivered))
        if msg.metadata.num_delivered == 1 and msg.data == b"twice":
            await msg.nak()
        else:
            await msg.ack()

    durable = await js.subscribe(
        "ev.d", durable="dur1", cb=handler, config=ConsumerConfig(ack_wait=2)
    )
    await js.publish("ev.d", b"twice")
    first = await asyncio.wait_for(seen.get(), TIMEOUT)
    again = await asyncio.wait_for(seen.get(), TIMEOUT)
    assert (first, again) == ((b"twice", 1), (b"twice", 2)), (first, again)
    info = await js.consumer_info("EV", "dur1")
    assert info.config.durable_name == "dur1", info.config
    await durable.unsubscribe()
    await js.delete_consumer("EV", "dur1")

    # An ack never sent: the message comes again after ack_wait.
    lazy = await js.subscribe("ev.lazy", config=ConsumerConfig(ack_wait=1))
    await js.publish("ev.lazy", b"unacked")
    first = await lazy.next_msg(timeout=TIMEOUT)
    second = await lazy.next_msg(timeout=TIMEOUT)
    assert first.data == second.data == b"unacked", (first, second)
    assert second.metadata.num_delivered == 2, second.metadata
    await second.ack()
    await lazy.unsubscribe()

    # A queue of push subscribers (deliver_group): each message to one of them.
    got = {"a": [], "b": []}

    def member(name):
        async def handler(msg):
            got[name].append(msg.data)
            await msg.ack()

        return handler

    first = await js.subscribe("ev.q", queue="workers", cb=member("a"))
    second = await js.subscribe("ev.q", queue="workers", cb=member("b"))
    info = await js.consumer_info("EV", "workers")
    assert info.config.deliver_group == "workers", info.config
    for i in range(6):
        await js.publish("ev.q", f"q{i}".encode())
    for _ in range(50):
        if len(got["a"]) + len(got["b"]) == 6:
            break
        await asyncio.sleep(0.1)
    delivered = sorted(got["a"] + got["b"])
    assert delivered == [f"q{i}".encode() for i in range(6)], got
    await first.unsubscribe()
    await second.unsubscribe()

    await js.delete_stream("EV")
    await nc.close()


if __name__ == "__main__":
    run(main)
