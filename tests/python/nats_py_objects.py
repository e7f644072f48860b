"""nats-py's Object Store, unmodified, against a running Canopy server: a bucket made,
an object of several chunks put and read back whole, listed, replaced, deleted (a
read of it then fails as on NATS), the bucket's status and its deletion.

Usage: python nats_py_objects.py nats://127.0.0.1:PORT
Exits non-zero with a message on the first thing that does not behave like NATS.
"""
import os

import nats
from nats.js.errors import ObjectNotFoundError

from checks_main import run


async def main(url: str) -> None:
    nc = await nats.connect(url, name="nats-py-objects")
    js = nc.jetstream(timeout=5)
    obs = await js.create_object_store("files")
    data = os.urandom(300_000)
    info = await obs.put("a/file.bin", data)
    assert (info.name, info.size) == ("a/file.bin", len(data)), info
    assert info.chunks > 1, info
    got = await obs.get("a/file.bin")
    assert got.data == data, (len(got.data), len(data))
    listed = [o.name for o in await obs.list()]
    assert listed == ["a/file.bin"], listed
    await obs.put("a/file.bin", b"smaller now")
    assert (await obs.get("a/file.bin")).data == b"smaller now"
    await obs.delete("a/file.bin")
    try:
        await obs.get("a/file.bin")
        raise AssertionError("a deleted object was read")
    except ObjectNotFoundError:
        pass
    status = await obs.status()
    assert status.bucket == "files", status
    assert await js.delete_object_store("files")
    await nc.close()


if __name__ == "__main__":
    run(main)
