"""Server CPU per delivered and acked message, by how many subjects have pending
messages, through nats-py (a client from another project) and the same JetStream
pull-consumer code against Canopy and nats-server: loads `--acks` messages (at least one a
subject) over `--subjects` subjects, makes a durable pull consumer over them (deliver all), then one
member fetches `--batch` at a time and acks each message until `--acks` are done.
The server's CPU time (user + system, read from /proc/<pid>/stat) is taken around that
phase only, once the consumer reports every loaded message pending, so neither the
load nor a new Canopy group's walk over its subjects is counted. Prints one JSON object.

    PYTHON benches/natspy_ackcost.py --server nats://127.0.0.1:4222 --pid PID --subjects 100000

`--load core` loads with plain publishes with a reply inbox (both servers store them and
answer with a PubAck; at most 4,000 unanswered), for the million-subject row: one
coroutine per acked publish spends minutes of nats-py's own CPU there.

Against nats-server the stream is made first (`BENCHACK` on `bench.py.ack.>`, file
storage); against Canopy the tenant's stream `default` holds them already.
"""

import argparse
import asyncio
import os
import sys
import time

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from natspy_report import report

PREFIX = "bench.py.ack"
CONSUMER = "benchack"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the whole line (11 and 12 after the name).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(js, subjects: int, msgs: int) -> None:
    window = asyncio.Semaphore(512)

    async def one(i: int) -> None:
        async with window:
            await js.publish(f"{PREFIX}.{i % subjects}", b"x" * 100)

    await asyncio.gather(*(one(i) for i in range(msgs)))


async def load_core(nc, subjects: int, msgs: int) -> None:
    """Plain publishes with a reply inbox, which both servers answer with a PubAck, up to
    `WINDOW` unanswered: no coroutine per message, and never faster than the server
    stores (JetStream drops plain publishes past its ingest queue)."""
    window = 4_000
    acked = 0

    async def count(_msg) -> None:
        nonlocal acked
        acked += 1

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=count)
    payload = b"x" * 100
    for i in range(msgs):
        while i - acked >= window:
            await asyncio.sleep(0.001)
        await nc.publish(f"{PREFIX}.{i % subjects}", payload, reply=inbox)
    deadline = time.monotonic() + 600
    while acked < msgs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {acked} of {msgs} publishes were acked within 600 s")
        await asyncio.sleep(0.05)
    await sub.unsubscribe()


def info_stream(canopy: bool) -> str:
    return "default" if canopy else "BENCHACK"


async def run(
    server: str, pid: int, subjects: int, acks: int, batch: int, how: str, ready_file: str
) -> dict:
    nc = await nats.connect(server, allow_reconnect=False)
    canopy = nc._server_info.get("go", "").startswith("canopy")
    js = nc.jetstream(timeout=30)
    # On either server a plain js.publish is stored where a stream holds its subject.
    await js.add_stream(name="BENCHACK", subjects=[f"{PREFIX}.>"])
    if how == "core":
        await load_core(nc, subjects, max(subjects, acks))
    else:
        await load(js, subjects, max(subjects, acks))
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, max_ack_pending=batch * 2)
    sub = await js.pull_subscribe(f"{PREFIX}.>", CONSUMER, config=config)
    # A new Canopy group first walks the subjects it matches; the acks are timed once
    # it knows their backlog, so what is measured is the ack path, not that walk.
    loaded = max(subjects, acks)
    deadline = time.monotonic() + 1800
    while (await js.consumer_info(info_stream(canopy), CONSUMER)).num_pending < loaded:
        if time.monotonic() > deadline:
            raise RuntimeError("the consumer did not find every message within 1800 s")
        await asyncio.sleep(0.2)
    done = 0
    if ready_file:
        # For a profiler to start on the ack phase alone.
        open(ready_file, "w").close()
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    while done < acks:
        try:
            got = await sub.fetch(batch, timeout=5)
        except nats.errors.TimeoutError:
            break
        for msg in got:
            await msg.ack()
        done += len(got)
    await nc.flush()
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu_before
    await nc.close()
    return {
        "shape": "natspy-ackcost",
        "server": "canopy" if canopy else "nats-server",
        "subjects_pending": subjects,
        "acked": done,
        "server_cpu_us_per_ack": round(cpu / max(done, 1) * 1e6, 1),
        "acks_per_sec": round(done / elapsed),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="nats://127.0.0.1:4222")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--subjects", type=int, default=1_000)
    parser.add_argument("--acks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--load", choices=["acked", "core"], default="acked")
    parser.add_argument("--ready-file", default="", help="made when the ack phase starts")
    args = parser.parse_args()
    return report(
        "natspy_ackcost",
        lambda: run(
            args.server, args.pid, args.subjects, args.acks, args.batch, args.load, args.ready_file
        ),
        ok=lambda result: result["acked"] >= args.acks,
    )


if __name__ == "__main__":
    sys.exit(main())
