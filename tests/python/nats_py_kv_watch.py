"""nats-py's NATS KV watching, unmodified, against a running Canopy server: what its
own documentation's examples do with `keys`, `history`, `watch` and `watchall`
(initial values, then live updates, with `include_history`, `ignore_deletes` and
`meta_only`), and an ordered `js.subscribe`. Each of these is an ordered push
consumer, which the client checks for gaps by sequence and by heartbeat.

Usage: python nats_py_kv_watch.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS KV.
"""
import asyncio

import nats
from nats.js.errors import NoKeysError

from checks_main import run

TIMEOUT = 5


async def next_update(watcher):
    return await watcher.updates(timeout=TIMEOUT)


async def initial(watcher):
    """Entries up to the client's end-of-initial-values marker (None)."""
    seen = []
    while True:
        entry = await next_update(watcher)
        if entry is None:
            return seen
        seen.append(entry)


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-kv-watch")
    js = nc.jetstream(timeout=TIMEOUT)
    kv = await js.create_key_value(bucket="watched", history=10)

    # An empty bucket: no keys, and a watch whose initial values are none.
    try:
        await kv.keys()
        raise AssertionError("keys() of an empty bucket gave keys")
    except NoKeysError:
        pass
    empty = await kv.watchall()
    assert await initial(empty) == [], "an empty bucket had initial values"
    await empty.stop()

    revisions = {}
    for key, value in [("a", b"1"), ("b", b"2"), ("c.dot", b"3"), ("a", b"4")]:
        revisions.setdefault(key, []).append(await kv.put(key, value))
    await kv.delete("b")

    keys = await kv.keys()
    assert sorted(keys) == ["a", "c.dot"], keys
    assert await kv.keys(filters=["dot"]) == ["c.dot"]

    history = await kv.history("a")
    assert [e.value for e in history] == [b"1", b"4"], history
    assert [e.revision for e in history] == revisions["a"], (history, revisions)
    assert [e.delta for e in history] == [1, 0], [e.delta for e in history]

    # watchall: the last value of each key first, in the order they were written.
    watcher = await kv.watchall()
    first = await initial(watcher)
    assert [(e.key, e.value, e.operation) for e in first] == [
        ("c.dot", b"3", None),
        ("a", b"4", None),
        ("b", b"", "DEL"),
    ], [(e.key, e.value, e.operation) for e in first]
    # Then what changes, live.
    rev = await kv.put("a", b"5")
    live = await next_update(watcher)
    assert (live.key, live.value, live.revision) == ("a", b"5", rev), live
    await kv.purge("c.dot")
    purged = await next_update(watcher)
    assert (purged.key, purged.operation) == ("c.dot", "PURGE"), purged
    await watcher.stop()

    # watch one key with its history, ignoring deletes, headers only.
    one = await kv.watch("a", include_history=True, meta_only=True)
    entries = await initial(one)
    assert [e.revision for e in entries] == revisions["a"] + [rev], entries
    assert all(e.value in (b"", None) for e in entries), "meta_only sent values"
    await one.stop()

    quiet = await kv.watch("b.>", ignore_deletes=True)
    assert await initial(quiet) == []
    await kv.put("b.x", b"x")
    update = await next_update(quiet)
    assert (update.key, update.value) == ("b.x", b"x"), update
    await kv.delete("b.x")
    await kv.put("b.y", b"y")
    update = await next_update(quiet)
    assert update.key == "b.y", f"a delete reached an ignore_deletes watch: {update}"
    await quiet.stop()

    # A watch outlives a quiet spell longer than two heartbeats' worth of the
    # client's gap check only if heartbeats come: none means a reset, which nats-py
    # does silently, so the check is that the update arrives exactly once.
    patient = await kv.watch("late")
    assert await initial(patient) == []
    await asyncio.sleep(1.5)
    await kv.put("late", b"on time")
    update = await next_update(patient)
    assert update.value == b"on time", update
    try:
        extra = await patient.updates(timeout=0.5)
        raise AssertionError(f"an update came twice: {extra}")
    except nats.errors.TimeoutError:
        pass
    await patient.stop()

    # An ordered subscription over a stream: everything, then live, in order.
    await js.add_stream(name="ORD", subjects=["ord.>"])
    for i in range(5):
        await js.publish(f"ord.{i % 2}", f"m{i}".encode())
    sub = await js.subscribe("ord.>", ordered_consumer=True)
    got = []
    for _ in range(5):
        msg = await sub.next_msg(timeout=TIMEOUT)
        got.append(msg.data)
    await js.publish("ord.9", b"live")
    got.append((await sub.next_msg(timeout=TIMEOUT)).data)
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4", b"live"], got
    await sub.unsubscribe()

    await js.delete_key_value("watched")
    await js.delete_stream("ORD")
    await nc.close()


if __name__ == "__main__":
    run(main)
