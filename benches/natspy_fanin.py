"""N publishers -> 1 subscriber through nats-py (a client from another project), each
publisher as fast as the server takes it, with no bound on what is in flight: the
fan-in where a server must either slow its publishers or cut the subscriber. Prints
one JSON object shaped like `canopy bench --json` (msgs_per_sec, delivered) plus
`lost` and `cut` (the subscriber was disconnected or told it is a slow consumer).

    PYTHON benches/natspy_fanin.py --server nats://127.0.0.1:4222 --msgs 1000000

PYTHON is a Python with nats-py installed. Each publisher is its own process (its own
connection), publishing its share of --msgs payloads of --size bytes round-robin over
--subjects subjects `bench.f.<i>`; the subscriber, in this process, subscribes to
`bench.f.>` with no client-side pending limit. The rate is messages received from
the first publish to the last message received. The run ends when every message
arrived or none came for 5 s after the publishers finished.
"""

import argparse
import asyncio
import multiprocessing
import sys
import time

import nats

from natspy_report import report


def publisher(server: str, index: int, count: int, size: int, subjects: int, go) -> None:
    async def run() -> None:
        conn = await nats.connect(server, allow_reconnect=False, max_reconnect_attempts=0)
        names = [f"bench.f.{i}" for i in range(max(subjects, 1))]
        payload = bytes(size)
        go.wait()
        for i in range(count):
            await conn.publish(names[(index + i) % len(names)], payload)
        await conn.flush(timeout=120)
        await conn.close()

    asyncio.run(run())


async def run(server: str, msgs: int, size: int, publishers: int, subjects: int) -> dict:
    cut = False

    async def error(e):
        nonlocal cut
        if "slow consumer" in str(e).lower():
            cut = True

    finished = False

    async def disconnected():
        nonlocal cut
        if not finished:
            cut = True

    conn = await nats.connect(server, allow_reconnect=False, error_cb=error,
                              disconnected_cb=disconnected)
    got = 0
    last = time.perf_counter()

    async def received(msg):
        nonlocal got, last
        got += 1
        last = time.perf_counter()

    await conn.subscribe("bench.f.>", cb=received, pending_msgs_limit=-1,
                         pending_bytes_limit=-1)
    await conn.flush()
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    share = [msgs // publishers + (1 if p < msgs % publishers else 0) for p in range(publishers)]
    procs = [ctx.Process(target=publisher, args=(server, p, share[p], size, subjects, go))
             for p in range(publishers)]
    for proc in procs:
        proc.start()
    await asyncio.sleep(1.0)  # every publisher connected and waiting
    start = time.perf_counter()
    go.set()
    while any(proc.is_alive() for proc in procs) or (got < msgs and time.perf_counter() - last < 5):
        await asyncio.sleep(0.05)
        if got >= msgs:
            break
    for proc in procs:
        proc.join()
    took = last - start
    finished = True
    try:
        await conn.close()
    except Exception:
        pass
    return {
        "shape": "natspy-fanin",
        "delivered": got,
        "lost": msgs - got,
        "cut": cut,
        "msgs_per_sec": got / took if took > 0 else 0.0,
    }


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="nats://127.0.0.1:4222")
    args.add_argument("--msgs", type=int, default=1_000_000)
    args.add_argument("--size", type=int, default=100)
    args.add_argument("--publishers", type=int, default=10)
    args.add_argument("--subjects", type=int, default=1000)
    a = args.parse_args()
    return report("natspy_fanin",
                  lambda: run(a.server, a.msgs, a.size, a.publishers, a.subjects))


if __name__ == "__main__":
    sys.exit(main())
