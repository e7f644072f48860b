"""1 publisher -> 1 subscriber through nats-py (a client from another project), for
benches/compare.sh: prints one JSON object shaped like `canopy bench --json`'s
(msgs_per_sec, delivered, latency p50/p99/max in ns).

    PYTHON benches/natspy_pubsub.py --server nats://127.0.0.1:4222 --msgs 200000

PYTHON is a Python with nats-py installed (`pip install nats-py`). Publisher and
subscriber are two connections in this one process; every payload (128 bytes) starts
with its send time, so latency is one way, measured here. At most --max-in-flight
messages are published and not yet received. A stall of 10 s fails the run (exit 1).
"""

import argparse
import asyncio
import sys
import time

import nats

from natspy_report import report


async def run(server: str, msgs: int, size: int, max_in_flight: int) -> dict:
    pub = await nats.connect(server, allow_reconnect=False)
    sub_conn = await nats.connect(server, allow_reconnect=False)
    got = 0
    latencies = []
    done = asyncio.Event()
    last = time.perf_counter_ns()

    async def received(msg):
        nonlocal got, last
        now = time.perf_counter_ns()
        latencies.append(now - int.from_bytes(msg.data[:8], "big"))
        got += 1
        last = now
        if got == msgs:
            done.set()

    await sub_conn.subscribe("bench.py", cb=received, pending_msgs_limit=-1,
                             pending_bytes_limit=-1)
    await sub_conn.flush()
    pad = bytes(size - 8)
    start = time.perf_counter_ns()
    for i in range(msgs):
        await pub.publish("bench.py", time.perf_counter_ns().to_bytes(8, "big") + pad)
        if i % 1000 == 999:
            while i + 1 - got > max_in_flight:
                await asyncio.sleep(0.0002)
                if time.perf_counter_ns() - last > 10e9:
                    raise RuntimeError(f"stalled: {got} of {i + 1} received")
    await pub.flush()
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 1)
        except asyncio.TimeoutError:
            if time.perf_counter_ns() - last > 10e9:
                raise RuntimeError(f"stalled: {got} of {msgs} received")
    took = last - start
    await pub.close()
    await sub_conn.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    return {
        "shape": "natspy-pubsub",
        "delivered": got,
        "msgs_per_sec": got / (took / 1e9),
        "latency": {"p50_ns": pick(0.5), "p99_ns": pick(0.99), "max_ns": latencies[-1]},
    }


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="nats://127.0.0.1:4222")
    args.add_argument("--msgs", type=int, default=200_000)
    args.add_argument("--size", type=int, default=128)
    args.add_argument("--max-in-flight", type=int, default=20_000)
    a = args.parse_args()
    return report("natspy_pubsub", lambda: run(a.server, a.msgs, max(a.size, 8), a.max_in_flight))


if __name__ == "__main__":
    sys.exit(main())
