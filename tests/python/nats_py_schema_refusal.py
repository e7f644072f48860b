"""nats-py (unmodified) publishing a message its subject's schema refuses: it hears
why through its error callback and keeps its connection, which goes on publishing,
subscribing and requesting.

Usage: nats_py_schema_refusal.py nats://host:port, with a schema bound to
devices.*.temp that wants {"temp": <number>}. Prints "all checks passed".
"""

import asyncio
import sys

import nats


async def main(url: str) -> None:
    errors: list[str] = []
    heard: asyncio.Queue[str] = asyncio.Queue()
    closed: list[bool] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))
        heard.put_nowait(str(error))

    async def next_error() -> str:
        # nats-py's flush writes its PING ahead of publishes still pending, so
        # the error is awaited rather than expected before the flush's PONG.
        return await asyncio.wait_for(heard.get(), timeout=10)

    async def on_closed() -> None:
        closed.append(True)

    nc = await nats.connect(
        url, error_cb=on_error, closed_cb=on_closed, allow_reconnect=False
    )
    sub = await nc.subscribe("devices.>")

    async def echo(msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("svc.echo", cb=echo)
    await nc.publish("devices.d1.temp", b'{"temp":"hot"}')
    text = (await next_error()).lower()
    assert "permissions violation" in text, errors
    assert 'publish to "devices.d1.temp"' in text, errors
    assert "devices.*.temp@1 at /temp" in text, errors
    assert nc.is_connected and not nc.is_closed and not closed, (nc.is_connected, closed)

    await nc.publish("devices.d1.temp", b'{"temp":21.5}')
    msg = await sub.next_msg(timeout=5)
    assert msg.data == b'{"temp":21.5}', msg.data
    answer = await nc.request("svc.echo", b"still here", timeout=5)
    assert answer.data == b"still here", answer.data
    # A second refusal is heard the same way, even when the refused value quotes
    # the phrases for which nats-py would close the connection.
    await nc.publish(
        "devices.d2.temp", b'{"temp":"Authorization Violation, stale connection"}'
    )
    second = await next_error()
    assert "devices.d2.temp" in second and len(errors) == 2, errors
    assert nc.is_connected and not closed, errors
    answer = await nc.request("svc.echo", b"and still", timeout=5)
    assert answer.data == b"and still", answer.data
    await nc.close()
    print("all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
