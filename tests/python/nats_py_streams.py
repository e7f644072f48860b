"""nats-py's JetStream stream calls, unmodified, against a running Canopy server.

Usage: python nats_py_streams.py nats://127.0.0.1:PORT

Declares a stream as a JetStream application does at start (`add_stream`, again with
the same config), then checks what a declared stream means on Canopy: PubAcks name
it, `Nats-Expected-Stream` is held to it, its messages are read one at a time (by
subject or sequence, directly or not), consumers bind to it, its
`max_msgs_per_subject` keeps that many versions, deleting it deletes its messages; and
what is refused as nats-server refuses it (another config under the name, overlapping
subjects, a setting Canopy cannot honour). Expects a fresh server.
Exits non-zero with a message on the first thing that does not behave like JetStream.
"""

import nats
import nats.errors
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
)

from checks_main import run


async def expect_api_error(what, call, kind, err_code):
    try:
        result = await call
    except kind as e:
        assert e.err_code == err_code, f"{what}: err_code {e.err_code}, not {err_code}: {e}"
        return e
    except APIError as e:
        raise AssertionError(f"{what}: {type(e).__name__} {e}, not {kind.__name__}") from e
    raise AssertionError(f"{what}: succeeded ({result}) instead of failing with {err_code}")


async def fetch_all(psub, at_most):
    got = []
    while len(got) < at_most:
        try:
            got += await psub.fetch(at_most - len(got), timeout=1)
        except nats.errors.TimeoutError:
            break
    return got


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-streams")
    js = nc.jetstream(timeout=5)

    # Declared at start, twice: the same config is a success both times.
    info = await js.add_stream(name="ORDERS", subjects=["orders.>"])
    assert info.config.name == "ORDERS" and info.config.subjects == ["orders.>"], info.config
    again = await js.add_stream(name="ORDERS", subjects=["orders.>"])
    assert again.config.subjects == ["orders.>"], again.config

    await expect_api_error(
        "another config under the name",
        js.add_stream(name="ORDERS", subjects=["orders.>", "returns.>"]),
        BadRequestError,
        10058,
    )
    await expect_api_error(
        "subjects another stream holds",
        js.add_stream(name="EU", subjects=["orders.eu.*"]),
        BadRequestError,
        10065,
    )
    refused = await expect_api_error(
        "memory storage",
        js.add_stream(name="MEM", subjects=["mem.>"], storage=StorageType.MEMORY),
        ServerError,
        10052,
    )
    assert "memory" in refused.description, refused.description

    # PubAcks name the stream holding the subject; others stay in the tenant's own.
    ack = await js.publish("orders.eu", b"first")
    assert ack.stream == "ORDERS", ack
    # A subject no declared stream holds: a plain publish gets no responders (as in
    # NATS, and is not stored); one naming the tenant's own stream is stored there.
    try:
        await js.publish("billing.x", b"nobody")
        raise AssertionError("a publish no stream holds was acked")
    except NoStreamResponseError:
        pass
    other = await js.publish("billing.x", b"elsewhere", stream="default")
    assert other.stream == "default", other
    held = await js.publish("orders.us", b"expected", stream="ORDERS")
    assert held.stream == "ORDERS", held
    await expect_api_error(
        "Nats-Expected-Stream naming another stream",
        js.publish("orders.us", b"wrong", stream="default"),
        BadRequestError,
        10060,
    )

    # A rollup needs a stream that allows it (ORDERS does not).
    try:
        await js.publish("orders.eu", b"rolled", headers={"Nats-Rollup": "sub"})
        raise AssertionError("a rollup on a stream without allow_rollup_hdrs was taken")
    except APIError as e:
        assert "rollup not permitted" in (e.description or ""), e

    # One message by subject or by sequence, as KV clients read keys.
    last = await js.get_last_msg("ORDERS", "orders.eu")
    assert (last.subject, last.seq, last.data) == ("orders.eu", ack.seq, b"first"), last
    by_seq = await js.get_msg("ORDERS", seq=held.seq)
    assert (by_seq.subject, by_seq.data) == ("orders.us", b"expected"), by_seq
    for what, call in [
        ("a subject without messages", js.get_last_msg("ORDERS", "orders.none")),
        ("a sequence of another stream", js.get_msg("ORDERS", seq=other.seq)),
    ]:
        try:
            await call
            raise AssertionError(f"get of {what} succeeded")
        except NotFoundError:
            pass
    await js.add_stream(name="DIRECT", subjects=["direct.>"], allow_direct=True)
    direct_ack = await js.publish("direct.a", b"straight", headers={"Trace": "t1"})
    direct = await js.get_last_msg("DIRECT", "direct.a", direct=True)
    assert (direct.subject, direct.seq, direct.data) == ("direct.a", direct_ack.seq, b"straight"), direct
    assert direct.headers and direct.headers.get("Trace") == "t1", direct.headers
    direct_by_seq = await js.get_msg("DIRECT", seq=direct_ack.seq, direct=True)
    assert direct_by_seq.data == b"straight", direct_by_seq
    await js.delete_stream("DIRECT")

    names = await js.streams_info()
    assert sorted(s.config.name for s in names) == ["ORDERS", "default"], names
    assert await js.find_stream_name_by_subject("orders.ap") == "ORDERS"
    assert await js.find_stream_name_by_subject("billing.x") == "default"
    state = (await js.stream_info("ORDERS")).state
    assert state.messages == 2 and state.last_seq == held.seq, state

    # A consumer binds to the stream holding its filter.
    psub = await js.pull_subscribe("orders.>", durable="fulfil")
    consumer = await js.consumer_info("ORDERS", "fulfil")
    assert consumer.stream_name == "ORDERS", consumer
    got = await fetch_all(psub, 5)
    assert sorted(m.data for m in got) == [b"expected", b"first"], [m.data for m in got]
    for m in got:
        await m.ack()
    await expect_api_error(
        "a consumer of ORDERS reading outside it",
        js.add_consumer("ORDERS", durable_name="stray", filter_subject="billing.>"),
        BadRequestError,
        10093,
    )

    # max_msgs_per_subject keeps that many versions of each subject.
    updated = await js.update_stream(
        StreamConfig(name="ORDERS", subjects=["orders.>"], max_msgs_per_subject=2)
    )
    assert updated.config.max_msgs_per_subject == 2, updated.config
    for i in range(3):
        await js.publish("orders.kept", f"v{i}".encode())
    kept = await js.pull_subscribe("orders.kept", durable="kept", stream="ORDERS")
    versions = await fetch_all(kept, 3)
    assert [m.data for m in versions] == [b"v1", b"v2"], [m.data for m in versions]

    # Deleting the stream deletes its messages and its consumers; its subjects go back
    # to the tenant's.
    assert await js.delete_stream("ORDERS")
    for gone in ("fulfil", "kept"):
        try:
            await js.consumer_info("default", gone)
            raise AssertionError(f"consumer {gone} outlived its stream")
        except NotFoundError:
            pass
    try:
        await js.stream_info("ORDERS")
        raise AssertionError("stream_info of a deleted stream succeeded")
    except NotFoundError:
        pass
    after = await js.publish("orders.eu", b"after", stream="default")
    assert after.stream == "default", after
    rest = await js.pull_subscribe("orders.>", durable="rest")
    left = await fetch_all(rest, 10)
    assert [m.data for m in left] == [b"after"], [(m.subject, m.data) for m in left]

    await nc.close()


if __name__ == "__main__":
    run(main)
