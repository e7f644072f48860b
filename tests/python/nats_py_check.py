"""nats-py, unmodified, against a running Canopy server.

Usage: python nats_py_check.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS.
"""
import asyncio
import sys

import nats
from nats.errors import NoRespondersError


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-check")
    other = await nats.connect(url, name="nats-py-other")

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

    # No responders
    try:
        await nc.request("nobody.home", b"", timeout=5)
        raise AssertionError("a request with no responders must fail")
    except NoRespondersError:
        pass

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
    print("nats-py: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
