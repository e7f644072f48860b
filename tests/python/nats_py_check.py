"""nats-py, unmodified, against a running Canopy server.

Usage: python nats_py_check.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS.
"""
import asyncio
import sys

import nats
from nats.errors import NoRespondersError
from nats.js.errors import NoStreamResponseError


async def main(url: str) -> None:
    errors = []

    async def record(error):
        errors.append(error)

    nc = await nats.connect(url, name="nats-py-check", error_cb=record)
    other = await nats.connect(url, name="nats-py-other", error_cb=record)

    # Wildcards
    got = []
    sub = await nc.subscribe("py.*.temp")
    rest = await nc.subscribe("py.>")
    await nc.flush()
    await other.publish("py.1.temp", b"21.5")
    await other.publish("py.1.hum", b"40")
    await other.flush()
    msg = await sub.next_msg(timeout=5)
    assert (msg.subject, msg.data) == ("py.1.temp", b"21.5"), msg
    for _ in range(2):
        got.append((await rest.next_msg(timeout=5)).subject)
    assert got == ["py.1.temp", "py.1.hum"], got
    # Unread messages would hold up the drain at the end.
    await sub.unsubscribe()
    await rest.unsubscribe()

    # Headers
    hsub = await nc.subscribe("py.headers")
    await nc.flush()
    await other.publish("py.headers", b"h", headers={"Canopy-Test": "yes"})
    msg = await hsub.next_msg(timeout=5)
    assert msg.headers and msg.headers.get("Canopy-Test") == "yes", msg.headers

    # Request/reply
    async def answer(m):
        await m.respond(b"pong:" + m.data)

    await other.subscribe("py.svc", cb=answer)
    await other.flush()
    reply = await nc.request("py.svc", b"ping", timeout=5)
    assert reply.data == b"pong:ping", reply

    # No responders, on a subject the default policies do not store (`_INBOX.>`)
    try:
        await nc.request("_INBOX.nobody.home", b"", timeout=5)
        raise AssertionError("a request with no responders must fail")
    except NoRespondersError:
        pass

    # JetStream's plain publish (a request without headers) that no service answers:
    # as in NATS, no responders where no stream holds the subject (and not stored);
    # once a stream does, the store answers with its PubAck, once per message.
    js = nc.jetstream()
    try:
        await js.publish("py.js.orders", b"nobody")
        raise AssertionError("a publish no stream holds was acked")
    except NoStreamResponseError:
        pass
    await js.add_stream(name="PYJS", subjects=["py.js.orders"])
    first = await js.publish("py.js.orders", b"one")
    second = await js.publish("py.js.orders", b"two")
    assert first.stream == "PYJS", first
    assert second.seq > first.seq, (first, second)
    # A watcher with a wildcard does not answer: the publish is still the store's.
    watch = await other.subscribe("py.js.>")
    await other.flush()
    third = await js.publish("py.js.orders", b"three")
    assert third.seq > second.seq, third
    seen = await watch.next_msg(timeout=5)
    assert (seen.subject, seen.data) == ("py.js.orders", b"three"), seen
    await watch.unsubscribe()
    # A service subscribed to the subject answers it, and only the service does.
    await other.subscribe("py.js.svc", cb=answer)
    await other.flush()
    reply = await nc.request("py.js.svc", b"ask", timeout=5)
    assert reply.data == b"pong:ask", reply

    # Queue group: each message once across the members
    counts = {"a": 0, "b": 0}

    def member(name):
        async def cb(_m):
            counts[name] += 1
        return cb

    await other.subscribe("py.work", queue="q", cb=member("a"))
    await other.subscribe("py.work", queue="q", cb=member("b"))
    await other.flush()
    for i in range(100):
        await nc.publish("py.work", str(i).encode())
    await nc.flush()
    for _ in range(50):
        if counts["a"] + counts["b"] == 100:
            break
        await asyncio.sleep(0.1)
    assert counts["a"] + counts["b"] == 100, counts
    await asyncio.sleep(0.2)
    assert counts["a"] + counts["b"] == 100, counts

    # Auto-unsubscribe after a maximum
    limited = await nc.subscribe("py.limited", max_msgs=2)
    await nc.flush()
    for i in range(5):
        await other.publish("py.limited", str(i).encode())
    await other.flush()
    first = await limited.next_msg(timeout=5)
    second = await limited.next_msg(timeout=5)
    assert (first.data, second.data) == (b"0", b"1")

    await nc.drain()
    await other.drain()
    assert not errors, errors
    print("nats-py: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
