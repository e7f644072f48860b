"""Acked JetStream publishes through nats-py (a client from another project): prints one
JSON object shaped like `canopy bench --json`'s (msgs_per_sec, latency p50/p99/max in
ns, the longest gap between two acks).

    PYTHON benches/natspy_durable.py --server nats://127.0.0.1:4222 --msgs 100000

`--tasks` coroutines on one connection each await `js.publish(subject, data)` one after
another (nats-py's plain JetStream publish: a request without headers, answered with a
PubAck), so `--tasks` publishes are in flight at once, over `--subjects` subjects
`bench.py.d.<i>`. Against nats-server the stream BENCHPY (file storage) is created
first; Canopy stores every subject by default and needs no stream. A publish answered
with an error, or no ack for 10 s, fails the run (exit 1).
"""

import argparse
import asyncio
import sys
import time

import nats

from natspy_report import report


async def run(server: str, msgs: int, size: int, tasks: int, subjects: int) -> dict:
    nc = await nats.connect(server, allow_reconnect=False)
    js = nc.jetstream(timeout=10)
    # On either server a plain js.publish is stored where a stream holds its subject.
    await js.add_stream(name="BENCHPY", subjects=["bench.py.d.>"])
    payload = bytes(size)
    latencies = []
    last = time.perf_counter_ns()
    max_gap = 0
    sent = 0

    async def publisher(offset: int) -> None:
        nonlocal last, max_gap, sent
        while sent < msgs:
            i = sent
            sent += 1
            t0 = time.perf_counter_ns()
            await js.publish(f"bench.py.d.{(i + offset) % subjects}", payload)
            now = time.perf_counter_ns()
            latencies.append(now - t0)
            max_gap = max(max_gap, now - last)
            last = now

    start = time.perf_counter_ns()
    last = start
    await asyncio.gather(*(publisher(t) for t in range(tasks)))
    took = time.perf_counter_ns() - start
    await nc.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    return {
        "shape": "natspy-durable",
        "delivered": len(latencies),
        "msgs_per_sec": len(latencies) / (took / 1e9),
        "latency": {"p50_ns": pick(0.5), "p99_ns": pick(0.99), "max_ns": latencies[-1]},
        "max_ack_gap_ns": max_gap,
    }


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="nats://127.0.0.1:4222")
    args.add_argument("--msgs", type=int, default=100_000)
    args.add_argument("--size", type=int, default=128)
    args.add_argument("--tasks", type=int, default=256)
    args.add_argument("--subjects", type=int, default=1000)
    a = args.parse_args()
    return report("natspy_durable", lambda: run(a.server, a.msgs, a.size, a.tasks, a.subjects))


if __name__ == "__main__":
    sys.exit(main())
