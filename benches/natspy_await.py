"""What `Canopy-Await` costs a publisher, through nats-py (a client from another
project): one publisher sends `--msgs` stored publishes one after another over
`--subjects` subjects and times each ack, first plain (a durable PubAck), then with
`Canopy-Await: <group>` while a consumer group's member (a JetStream pull consumer,
another connection) takes each message and acks it. Prints one JSON object with both
latency distributions in microseconds (p50, p90, p99, max) and the ratio of their
medians.

    PYTHON benches/natspy_await.py --server nats://127.0.0.1:4222 --msgs 2000

An awaited ack comes back only after the member's ack, so its latency is the durable
publish, the group's hand-off to the member, the member's ack and the group's answer.
A run where any awaited ack reports a pending group fails (exit 1).
"""

import argparse
import asyncio
import json
import sys
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from natspy_report import report

PREFIX = "bench.py.await"
GROUP = "benchawait"


def summary(samples: list) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6, 1)

    return {"p50_us": at(0.50), "p90_us": at(0.90), "p99_us": at(0.99), "max_us": at(1.0)}


async def member(server: str, stop: asyncio.Event, ready: asyncio.Event) -> None:
    """Pulls the group as a JetStream consumer and acks each message as it comes."""
    nc = await nats.connect(server, allow_reconnect=False)
    js = nc.jetstream(timeout=10)
    config = ConsumerConfig(
        durable_name=GROUP,
        deliver_policy=DeliverPolicy.NEW,
        ack_policy=AckPolicy.EXPLICIT,
        max_ack_pending=1000,
    )
    sub = await js.pull_subscribe(f"{PREFIX}.>", durable=GROUP, config=config)
    ready.set()
    while not stop.is_set():
        try:
            got = await sub.fetch(10, timeout=0.5)
        except nats.errors.TimeoutError:
            continue
        for msg in got:
            await msg.ack()
    await nc.close()


async def timed(js, msgs: int, subjects: int) -> list:
    """Plain stored publishes, one after another: each one's time to its PubAck."""
    samples = []
    for i in range(msgs):
        started = time.perf_counter()
        await js.publish(f"{PREFIX}.{i % subjects}", b"x" * 100)
        samples.append(time.perf_counter() - started)
    return samples


async def run(server: str, msgs: int, subjects: int, timeout_ms: int) -> dict:
    nc = await nats.connect(server, allow_reconnect=False)
    if not nc._server_info.get("go", "").startswith("canopy"):
        raise RuntimeError("Canopy-Await is Canopy's: run this against a Canopy server")
    js = nc.jetstream(timeout=10)
    # A plain js.publish is stored where a stream holds its subject.
    await js.add_stream(name="BENCHAWAIT", subjects=[f"{PREFIX}.>"])
    stop, ready = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(member(server, stop, ready))
    await asyncio.wait_for(ready.wait(), 10)
    await timed(js, 100, subjects)  # warm up
    plain = await timed(js, msgs, subjects)
    awaited_headers = {"Canopy-Await": GROUP, "Canopy-Await-Timeout": f"{timeout_ms}ms"}
    # Each awaited ack's body says which groups passed; a raw request reads it.
    awaited, missed = [], 0
    for i in range(msgs):
        started = time.perf_counter()
        answer = await nc.request(
            f"{PREFIX}.{i % subjects}", b"x" * 100, timeout=10, headers=awaited_headers
        )
        awaited.append(time.perf_counter() - started)
        body = json.loads(answer.data)
        if body.get("await", {}).get("pending"):
            missed += 1
    stop.set()
    await worker
    await js.delete_consumer("default", GROUP)
    await nc.close()
    plain_summary, awaited_summary = summary(plain), summary(awaited)
    return {
        "shape": "natspy-await",
        "msgs": msgs,
        "subjects": subjects,
        "plain": plain_summary,
        "awaited": awaited_summary,
        "awaited_not_passed": missed,
        "p50_ratio": round(awaited_summary["p50_us"] / plain_summary["p50_us"], 2),
        "p99_ratio": round(awaited_summary["p99_us"] / plain_summary["p99_us"], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="nats://127.0.0.1:4222")
    parser.add_argument("--msgs", type=int, default=2_000)
    parser.add_argument("--subjects", type=int, default=100)
    parser.add_argument("--timeout-ms", type=int, default=5_000)
    args = parser.parse_args()
    return report(
        "natspy_await",
        lambda: run(args.server, args.msgs, args.subjects, args.timeout_ms),
        ok=lambda result: result["awaited_not_passed"] == 0,
    )


if __name__ == "__main__":
    sys.exit(main())
