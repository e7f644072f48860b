"""nats-py's JetStream pull consumers, unmodified, against a running Canopy server.

Usage: python nats_py_pull.py nats://127.0.0.1:PORT [--create-stream]

Canopy's tenant has one stream, "default", that stores every subject; its durable pull
consumers are made by `js.pull_subscribe` / `js.add_consumer`. `--create-stream` first
(re)creates a stream "default" on ["orders.>", "jobs.>"] so the same checks run
unchanged against a real `nats-server -js` (which refuses a stream on ">" unless
no_ack is set). Expects a fresh server: a consumer with deliver_policy "all" would
also see an earlier run's orders.* messages.
Exits non-zero with a message on the first thing that does not behave like JetStream.
"""
import asyncio
import sys
import time
import traceback

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

SUBJECTS = ["orders.eu", "orders.us", "orders.ap"]
PER_SUBJECT = 5
FETCH_TIMEOUT = 2


async def expect_fetch_timeout(psub, batch, timeout=1.0, what="an empty consumer"):
    """fetch must raise nats.errors.TimeoutError after about `timeout`: not return, not hang."""
    start = time.monotonic()
    try:
        msgs = await psub.fetch(batch, timeout=timeout)
    except nats.errors.TimeoutError:
        pass
    except asyncio.TimeoutError as e:
        # nats-py raises a bare asyncio.TimeoutError (not nats.errors.TimeoutError)
        # when a 408 reaches it before its own deadline (client.py:1293-1302).
        raise AssertionError(
            f"fetch(batch={batch}) on {what} raised {type(e).__module__}.{type(e).__name__}, "
            "not nats.errors.TimeoutError: a 408 arrived before the client's own deadline"
        ) from e
    else:
        raise AssertionError(
            f"fetch(batch={batch}) on {what} returned {[(m.subject, m.data) for m in msgs]} "
            "instead of raising nats.errors.TimeoutError"
        )
    elapsed = time.monotonic() - start
    assert timeout * 0.8 <= elapsed <= timeout + 2, (
        f"fetch(batch={batch}, timeout={timeout}) timed out after {elapsed:.2f}s"
    )
    # A server may answer an expired pull with a 408 a little after the client gave
    # up; let it land now, so the next fetch drops it rather than taking it for its
    # own answer.
    await asyncio.sleep(0.25)


async def fetch_one(psub, what):
    try:
        msgs = await psub.fetch(1, timeout=FETCH_TIMEOUT)
    except nats.errors.TimeoutError:
        raise AssertionError(f"fetch(1) got nothing within {FETCH_TIMEOUT}s: expected {what}")
    assert len(msgs) == 1, msgs
    return msgs[0]


async def wait_for_info(js, consumer, what, **expected):
    """Polls consumer_info until the fields have the expected values (acks are async)."""
    deadline = time.monotonic() + 5
    while True:
        info = await js.consumer_info("default", consumer)
        got = {k: getattr(info, k) for k in expected}
        if got == expected:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"consumer_info({consumer}) {what}: expected {expected}, got {got}")
        await asyncio.sleep(0.1)


async def main(url: str, create_stream: bool) -> None:
    errors = []

    async def record(error):
        errors.append(error)

    nc = await nats.connect(url, name="nats-py-pull", error_cb=record)
    js = nc.jetstream(timeout=5)

    if create_stream:
        try:
            await js.delete_stream("default")
        except NotFoundError:
            pass
        await js.add_stream(name="default", subjects=["orders.>", "jobs.>"])
    for leftover in ("billing", "shipping"):
        try:
            await js.delete_consumer("default", leftover)
        except NotFoundError:
            pass

    # 3 subjects x 5 messages, interleaved, each stored by "default" (named: a plain
    # js.publish to a subject no declared stream holds gets no responders, as in NATS)
    last_seq = 0
    for i in range(PER_SUBJECT):
        for subject in SUBJECTS:
            ack = await js.publish(subject, f"{subject}:{i}".encode(), stream="default")
            assert ack.stream == "default", ack
            assert ack.seq > last_seq, (ack, last_seq)
            last_seq = ack.seq
    total = len(SUBJECTS) * PER_SUBJECT

    # A durable pull consumer, made by pull_subscribe (STREAM.NAMES, CONSUMER.INFO, CREATE)
    psub = await js.pull_subscribe("orders.>", durable="billing")
    info = await js.consumer_info("default", "billing")
    assert (info.name, info.stream_name) == ("billing", "default"), info
    assert info.config.durable_name == "billing", info.config
    assert info.config.filter_subject == "orders.>", info.config
    assert info.num_pending == total, (
        f"a new consumer should see the {total} messages just published, not {info.num_pending}"
        " (is the server fresh?)"
    )
    assert info.num_ack_pending == 0, info
    # pull_subscribe again binds to the existing durable (CONSUMER.INFO finds it)
    again = await js.pull_subscribe("orders.>", durable="billing")
    await again.unsubscribe()

    # fetch(10) until all 15 arrive: each once, each subject in order, num_delivered 1
    got = []
    seen = {subject: [] for subject in SUBJECTS}
    for _ in range(10):
        if len(got) == total:
            break
        try:
            batch = await psub.fetch(10, timeout=FETCH_TIMEOUT)
        except nats.errors.TimeoutError:
            continue
        for msg in batch:
            assert msg.subject in seen, f"unexpected subject {msg.subject!r} ({msg.data!r})"
            subject, index = msg.data.decode().rsplit(":", 1)
            assert subject == msg.subject, (msg.subject, msg.data)
            expected = len(seen[subject])
            assert int(index) == expected, (
                f"{subject}: got message {index} after {seen[subject]}, expected {expected}"
            )
            seen[subject].append(int(index))
            meta = msg.metadata
            assert (meta.stream, meta.consumer) == ("default", "billing"), meta
            assert meta.num_delivered == 1, (msg.subject, msg.data, meta)
            got.append(msg)
    assert len(got) == total, f"fetched {len(got)} of {total}: {seen}"
    for subject in SUBJECTS:
        seqs = [m.metadata.sequence.stream for m in got if m.subject == subject]
        assert seqs == sorted(set(seqs)), (subject, seqs)
    await wait_for_info(js, "billing", "with all fetched and none acked",
                        num_ack_pending=total, num_pending=0)

    # Ack them: some with ack_sync, some after an in_progress
    for n, msg in enumerate(got):
        if n % 4 == 0:
            await msg.in_progress()
        if n % 3 == 0:
            await msg.ack_sync(timeout=2)
        else:
            await msg.ack()
    await nc.flush(timeout=5)
    await wait_for_info(js, "billing", "after acking all", num_ack_pending=0, num_pending=0)
    # Everything delivered was acked: the ack floor is the last delivery.
    info = await js.consumer_info("default", "billing")
    assert info.ack_floor.consumer_seq == info.delivered.consumer_seq == total, info
    assert info.ack_floor.stream_seq == last_seq, (info.ack_floor, last_seq)

    # Nothing left: fetch raises TimeoutError after its timeout, for both fetch paths
    await expect_fetch_timeout(psub, 1)
    await expect_fetch_timeout(psub, 10)

    # nak: redelivered, num_delivered 2
    await js.publish("orders.nak", b"nak-me", stream="default")
    first = await fetch_one(psub, "orders.nak")
    assert (first.subject, first.data, first.metadata.num_delivered) == ("orders.nak", b"nak-me", 1), first
    await first.nak()
    again = await fetch_one(psub, "orders.nak redelivered after a nak")
    assert (again.subject, again.data) == ("orders.nak", b"nak-me"), again
    assert again.metadata.num_delivered == 2, again.metadata
    assert again.metadata.sequence.stream == first.metadata.sequence.stream, (first.metadata, again.metadata)
    await again.ack_sync(timeout=2)

    # nak with a delay: not redelivered before the delay, then with num_delivered 2
    await js.publish("orders.later", b"later", stream="default")
    first = await fetch_one(psub, "orders.later")
    await first.nak(delay=0.5)
    start = time.monotonic()
    later = await psub.fetch(10, timeout=3)
    elapsed = time.monotonic() - start
    assert [(m.subject, m.data) for m in later] == [("orders.later", b"later")], later
    assert later[0].metadata.num_delivered == 2, later[0].metadata
    assert elapsed >= 0.4, f"a nak with delay=0.5 was redelivered after {elapsed:.2f}s"
    await later[0].ack()

    # term: never redelivered
    await js.publish("orders.term", b"term-me", stream="default")
    doomed = await fetch_one(psub, "orders.term")
    assert (doomed.subject, doomed.data) == ("orders.term", b"term-me"), doomed
    await doomed.term()
    await nc.flush(timeout=5)
    await expect_fetch_timeout(psub, 10, what="a consumer whose last message was term'd")
    await wait_for_info(js, "billing", "after nak/term", num_ack_pending=0, num_pending=0)

    # A consumer made by add_consumer with a durable name, bound by pull_subscribe
    await js.publish("jobs.pack", b"pack:0", stream="default")
    await js.publish("jobs.pack", b"pack:1", stream="default")
    created = await js.add_consumer(
        "default",
        ConsumerConfig(
            durable_name="shipping",
            filter_subject="jobs.>",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
        ),
    )
    assert (created.name, created.stream_name) == ("shipping", "default"), created
    assert created.config.filter_subject == "jobs.>", created.config
    jsub = await js.pull_subscribe("jobs.>", durable="shipping")
    jobs = []
    for _ in range(5):
        if len(jobs) == 2:
            break
        try:
            jobs.extend(await jsub.fetch(10, timeout=FETCH_TIMEOUT))
        except nats.errors.TimeoutError:
            pass
    assert [(m.subject, m.data) for m in jobs] == [("jobs.pack", b"pack:0"), ("jobs.pack", b"pack:1")], jobs
    assert all(m.metadata.consumer == "shipping" for m in jobs), [m.metadata for m in jobs]
    for msg in jobs:
        await msg.ack_sync(timeout=2)
    await wait_for_info(js, "shipping", "after acking its jobs", num_ack_pending=0, num_pending=0)
    # billing's filter (orders.>) kept the jobs away from it
    await wait_for_info(js, "billing", "after jobs.* publishes", num_ack_pending=0, num_pending=0)

    # delete_consumer, then consumer_info is NotFoundError
    await psub.unsubscribe()
    await jsub.unsubscribe()
    assert await js.delete_consumer("default", "billing") is True
    try:
        await js.consumer_info("default", "billing")
        raise AssertionError("consumer_info of a deleted consumer must raise NotFoundError")
    except NotFoundError:
        pass
    assert await js.delete_consumer("default", "shipping") is True

    # stream_info of the tenant's stream
    stream = await js.stream_info("default")
    assert stream.config.name == "default", stream.config
    assert stream.state.messages >= total + 5, stream.state

    await nc.drain()
    assert not errors, errors
    print("nats-py pull: all checks passed")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    unknown = flags - {"--create-stream"}
    if len(args) != 1 or unknown:
        sys.exit(f"usage: {sys.argv[0]} nats://HOST:PORT [--create-stream]")
    try:
        asyncio.run(asyncio.wait_for(main(args[0], "--create-stream" in flags), 120))
    except BaseException as e:  # noqa: BLE001 - report any failure the same way
        traceback.print_exc()
        sys.exit(f"nats-py pull: FAILED: {type(e).__name__}: {e}")
