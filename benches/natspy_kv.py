"""NATS KV puts and gets through nats-py (a client from another project): prints one JSON
object with the put and get rates and their latency p50/p99 in ns.

    PYTHON benches/natspy_kv.py --server nats://127.0.0.1:4222 --keys 2000 --tasks 16

A bucket BENCHKV (history 1) is created on either server the same way (nats-py's
`create_key_value`; on Canopy a stream over `$KV.BENCHKV.>`), then `--tasks`
coroutines on one connection put `--keys` keys of `--size` bytes (each put awaits its
PubAck), then get each key back (nats-py's get: `STREAM.MSG.GET` by last subject). A
failed put or get fails the run (exit 1).
"""

import argparse
import asyncio
import sys
import time

import nats

from natspy_report import report


async def timed(count: int, tasks: int, one) -> tuple[float, list[int]]:
    latencies = []
    next_key = 0

    async def worker() -> None:
        nonlocal next_key
        while next_key < count:
            i = next_key
            next_key += 1
            t0 = time.perf_counter_ns()
            await one(i)
            latencies.append(time.perf_counter_ns() - t0)

    start = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    took = time.perf_counter_ns() - start
    latencies.sort()
    return count / (took / 1e9), latencies


def summary(rate: float, latencies: list[int]) -> dict:
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    return {"per_sec": rate, "p50_ns": pick(0.5), "p99_ns": pick(0.99)}


async def run(server: str, keys: int, size: int, tasks: int) -> dict:
    nc = await nats.connect(server, allow_reconnect=False)
    js = nc.jetstream(timeout=10)
    kv = await js.create_key_value(bucket="BENCHKV", history=1)
    value = bytes(size)

    async def put(i: int) -> None:
        await kv.put(f"k{i}", value)

    async def get(i: int) -> None:
        entry = await kv.get(f"k{i}")
        if len(entry.value) != size:
            raise RuntimeError(f"k{i}: {len(entry.value)} bytes back, not {size}")

    put_rate, put_latencies = await timed(keys, tasks, put)
    get_rate, get_latencies = await timed(keys, tasks, get)
    await nc.close()
    return {
        "shape": "natspy-kv",
        "keys": keys,
        "put": summary(put_rate, put_latencies),
        "get": summary(get_rate, get_latencies),
    }


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="nats://127.0.0.1:4222")
    args.add_argument("--keys", type=int, default=2000)
    args.add_argument("--size", type=int, default=128)
    args.add_argument("--tasks", type=int, default=16)
    a = args.parse_args()
    return report("natspy_kv", lambda: run(a.server, a.keys, a.size, a.tasks))


if __name__ == "__main__":
    sys.exit(main())
