"""nats-py's NATS KV, unmodified, against a running Canopy server: what its own
documentation's examples do short of watching (create and bind a bucket, put, get,
create, update with the expected revision, delete, purge, status, delete the bucket)
and the error cases (a wrong revision, a key that exists, an unknown bucket, a value
over the bucket's max_value_size).

Usage: python nats_py_kv.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS KV.
"""

import nats
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)

from checks_main import run


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-kv")
    js = nc.jetstream(timeout=5)

    try:
        await js.key_value("cfg")
        raise AssertionError("an unknown bucket was bound")
    except BucketNotFoundError:
        pass

    kv = await js.create_key_value(bucket="cfg", history=5)
    again = await js.key_value("cfg")
    status = await again.status()
    assert status.bucket == "cfg" and status.history == 5, status

    first = await kv.put("color", b"red")
    entry = await kv.get("color")
    assert (entry.key, entry.value, entry.revision) == ("color", b"red", first), entry
    second = await kv.update("color", b"blue", last=first)
    assert second > first, (first, second)
    try:
        await kv.update("color", b"green", last=first)
        raise AssertionError("an update at an old revision succeeded")
    except KeyWrongLastSequenceError:
        pass
    assert (await kv.get("color")).value == b"blue"
    # An earlier revision is still there (history 5).
    old = await kv.get("color", revision=first)
    assert old.value == b"red", old

    made = await kv.create("size", b"m")
    try:
        await kv.create("size", b"l")
        raise AssertionError("create of an existing key succeeded")
    except KeyWrongLastSequenceError:
        pass
    try:
        await kv.get("missing")
        raise AssertionError("get of a missing key succeeded")
    except KeyNotFoundError:
        pass

    # Delete leaves a marker; create works again on a deleted key.
    await kv.delete("size")
    try:
        await kv.get("size")
        raise AssertionError("get of a deleted key succeeded")
    except (KeyDeletedError, KeyNotFoundError):
        pass
    remade = await kv.create("size", b"s")
    assert remade > made and (await kv.get("size")).value == b"s"

    # Purge drops the key's history: the earlier revisions are gone.
    await kv.purge("color")
    try:
        await kv.get("color")
        raise AssertionError("get of a purged key succeeded")
    except (KeyDeletedError, KeyNotFoundError):
        pass
    try:
        await kv.get("color", revision=first)
        raise AssertionError("a revision from before the purge is still there")
    except (KeyNotFoundError, KeyDeletedError, NotFoundError):
        pass

    # A bucket's max_value_size (its stream's max_msg_size) refuses a larger value.
    small = await js.create_key_value(bucket="small", max_value_size=32)
    await small.put("fits", b"x" * 32)
    try:
        await small.put("big", b"x" * 64)
        raise AssertionError("a value over max_value_size was taken")
    except APIError as error:
        assert error.err_code == 10054, error
    assert await js.delete_key_value("small")

    assert await js.delete_key_value("cfg")
    try:
        await js.key_value("cfg")
        raise AssertionError("a deleted bucket was bound")
    except BucketNotFoundError:
        pass
    await nc.close()


if __name__ == "__main__":
    run(main)
