"""Consumer-group delivery through nats-py (a client from another project): loads
`--msgs` messages over `--subjects` subjects `bench.py.g.<i>`, then `--members`
members (one connection each) pull `--batch` at a time and ack every message, and
prints one JSON object: messages delivered and acked per second.

    PYTHON benches/natspy_groups.py --server nats://127.0.0.1:4222 --msgs 50000

Against Canopy the members pull a consumer group: with `--api canopy` (the default)
through `$CANOPY.group.next` (start at all, one in flight per subject: strict order
per subject), acking on each delivery's reply subject; with `--api jetstream` through
the same JetStream pull consumer code as against nats-server (`pull_subscribe`,
`fetch`, `ack`; `--per-subject N` sets Canopy's in flight per subject, by default
JetStream's max_ack_pending). Against nats-server they share a JetStream pull consumer
on a file stream, which keeps no order per subject. A run that delivers less than it
loaded within 60 s fails (exit 1). With `--poison N`, N more messages go to one subject
whose every delivery the members nack (each goes to the dead-letter subject after the
group's 5 deliveries); the rate counts only the good messages, so it shows what a
stuck subject costs the others.
"""

import argparse
import asyncio
import json
import sys
import time

import nats
from nats.js.api import ConsumerConfig

from natspy_report import report

PREFIX = "bench.py.g"
POISON = f"{PREFIX}.poison"


async def load(nc, canopy: bool, msgs: int, subjects: int, poison: int) -> None:
    js = nc.jetstream(timeout=10)
    # On either server a plain js.publish is stored where a stream holds its subject.
    await js.add_stream(name="BENCHPYG", subjects=[f"{PREFIX}.>"])
    window = asyncio.Semaphore(512)

    async def one(i: int) -> None:
        async with window:
            await js.publish(f"{PREFIX}.{i % subjects}", b"x" * 100)

    await asyncio.gather(*(one(i) for i in range(msgs)))

    async def bad(i: int) -> None:
        async with window:
            await js.publish(POISON, b"x" * 100)

    await asyncio.gather(*(bad(i) for i in range(poison)))


async def canopy_member(
    server: str, name: str, batch: int, wanted: int, count: list, poison: str
) -> None:
    nc = await nats.connect(server, allow_reconnect=False)
    while count[0] < wanted:
        inbox = nc.new_inbox()
        got, ended = [], asyncio.get_running_loop().create_future()

        async def take(msg):
            if msg.headers and msg.headers.get("Canopy-Status"):
                if not ended.done():
                    ended.set_exception(RuntimeError(f"group.next refused: {msg.data!r}"))
                return
            if msg.headers and msg.headers.get("Canopy-Done"):
                if not ended.done():
                    ended.set_result(None)
                return
            got.append(msg)

        sub = await nc.subscribe(inbox, cb=take)
        body = {"group": "benchpy", "max": batch, "wait_ms": 1000, "member": name}
        await nc.publish("$CANOPY.group.next", json.dumps(body).encode(), reply=inbox)
        await asyncio.wait_for(ended, 10)
        await sub.unsubscribe()
        for msg in got:
            # The poison subject's messages always fail: nacked until they run out of
            # deliveries and go to the dead-letter subject.
            if msg.headers.get("Canopy-Subject") == poison:
                await nc.publish(msg.reply, b"-NAK")
            else:
                await nc.publish(msg.reply, b"+ACK")
                count[0] += 1
    await nc.flush()
    await nc.close()


async def jetstream_member(
    server: str, batch: int, wanted: int, count: list, per_subject
) -> None:
    nc = await nats.connect(server, allow_reconnect=False)
    config = None
    if per_subject:
        config = ConsumerConfig(metadata={"canopy.per_subject": str(per_subject)})
    consumer = await nc.jetstream(timeout=10).pull_subscribe(
        f"{PREFIX}.>", "benchpy", config=config
    )
    while count[0] < wanted:
        try:
            got = await consumer.fetch(batch, timeout=1)
        except nats.errors.TimeoutError:
            got = []
        for msg in got:
            await msg.ack()
        count[0] += len(got)
    await nc.flush()
    await nc.close()


async def run(
    server: str,
    msgs: int,
    subjects: int,
    members: int,
    batch: int,
    api: str,
    per_subject,
    poison: int,
) -> dict:
    nc = await nats.connect(server, allow_reconnect=False)
    canopy = nc._server_info.get("go", "").startswith("canopy")
    if poison and not (canopy and api == "canopy"):
        raise RuntimeError("--poison needs Canopy's own group API (--api canopy)")
    await load(nc, canopy, msgs, subjects, poison)
    group_api = canopy and api == "canopy"
    if group_api:
        spec = {"name": "benchpy", "pattern": f"{PREFIX}.>", "start": "all", "per_member": 100000}
        answer = await nc.request("$CANOPY.group.create", json.dumps(spec).encode(), timeout=10)
        if answer.headers and answer.headers.get("Canopy-Status"):
            raise RuntimeError(f"group.create refused: {answer.data!r}")
    count = [0]
    started = time.monotonic()
    if group_api:
        work = [
            canopy_member(server, f"m{m}", batch, msgs, count, POISON) for m in range(members)
        ]
    else:
        work = [
            jetstream_member(server, batch, msgs, count, per_subject if canopy else None)
            for _ in range(members)
        ]
    await asyncio.wait_for(asyncio.gather(*work), 60)
    elapsed = time.monotonic() - started
    await nc.close()
    return {
        "shape": "natspy-groups",
        "server": "canopy" if canopy else "nats-server",
        "api": api if canopy else "jetstream",
        "delivered": count[0],
        "members": members,
        "subjects": subjects,
        "poison_messages": poison,
        "msgs_per_sec": count[0] / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="nats://127.0.0.1:4222")
    parser.add_argument("--msgs", type=int, default=50_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--api", choices=["canopy", "jetstream"], default="canopy")
    parser.add_argument("--per-subject", type=int, default=None)
    parser.add_argument(
        "--poison",
        type=int,
        default=0,
        help="messages also stored on one subject that members always nack (--api canopy)",
    )
    args = parser.parse_args()
    return report(
        "natspy_groups",
        lambda: run(
            args.server,
            args.msgs,
            args.subjects,
            args.members,
            args.batch,
            args.api,
            args.per_subject,
            args.poison,
        ),
        ok=lambda result: result["delivered"] >= args.msgs,
    )


if __name__ == "__main__":
    sys.exit(main())
