"""MQTT 5 exchanges between clients, against a running broker: request/response between
two MQTT clients, one copy for overlapping subscriptions, and subscriptions made right
after a reconnect with the same client id. Run from tests/it/mqtt/exchanges.rs.

Usage: python mqtt5_exchanges.py HOST PORT SCENARIO [ARGS...]
       python mqtt5_exchanges.py --list

Prints "ok SCENARIO" and exits 0 when the broker behaves as the MQTT 5 specification
says; otherwise prints "FAIL SCENARIO: what differed" on stderr and exits 1. The
clients (paho-mqtt 2.x and the raw-socket client) come from mqtt_scenarios.py, with
the same bounded waits and watchdog.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mqtt_scenarios import (  # noqa: E402  (after the path is set)
    PUBACK, PUBLISH, QUIET, WAIT, Client, Fail, Raw, check, describe, expect_msg, mqtt,
    sub_ids,
)
from mqtt_scenarios import main as run_scenarios  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def props_of(msg):
    """(Response Topic, Correlation Data) of a received v5 message."""
    props = getattr(msg, "properties", None)
    topic = getattr(props, "ResponseTopic", None) if props is not None else None
    data = getattr(props, "CorrelationData", None) if props is not None else None
    return topic, (bytes(data) if data is not None else None)


def publish_props(response_topic=None, correlation=None):
    props = Properties(PacketTypes.PUBLISH)
    if response_topic is not None:
        props.ResponseTopic = response_topic
    if correlation is not None:
        props.CorrelationData = correlation
    return props


def subscribe_with(client, topic_filter, qos=1, no_local=False, subscription_id=None):
    """A v5 SUBSCRIBE with options; returns the SUBACK codes."""
    props = None
    if subscription_id is not None:
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = subscription_id
    rc, mid = client.c.subscribe(
        [(topic_filter, SubscribeOptions(qos=qos, noLocal=no_local))], properties=props)
    check(rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe {topic_filter}: {mqtt.error_string(rc)}")
    return client.event("suback", lambda e: e[1] == mid)[2]


@scenario
def request_response(host, port, args):
    """Request/response between two MQTT 5 clients (MQTT 5 section 4.10): A and B
    subscribe t/a; A publishes to t/a with Response Topic t/a and Correlation Data; B
    receives it with that same Response Topic and Correlation Data and answers to the
    Response Topic with the Correlation Data; A receives the answer with it. The
    broker passes Response Topic and Correlation Data on unchanged (section 3.3.2.3.5:
    the server MUST send the Response Topic unaltered)."""
    qos = int(args[0]) if args else 1
    a = Client(host, port, "v5", "rq-a")
    a.subscribe_ok([("t/a", qos)])
    b = Client(host, port, "v5", "rq-b")
    b.subscribe_ok([("t/a", qos)])
    correlation = b"\x00corr-42\xff"
    a.publish("t/a", b"request", qos, props=publish_props("t/a", correlation))

    request = b.next(what="the request on B's t/a subscription")
    expect_msg(request, "t/a", b"request", qos)
    check(props_of(request) == ("t/a", correlation),
          f"B must get Response Topic 't/a' and Correlation Data {correlation!r} unchanged; "
          f"got Response Topic and Correlation Data {props_of(request)}")
    mine = a.next(what="A's own request on its t/a subscription")
    check(props_of(mine) == ("t/a", correlation),
          f"A's copy of its request: Response Topic and Correlation Data {props_of(mine)}")

    response_topic, data = props_of(request)
    b.publish(response_topic, b"answer", qos, props=publish_props(correlation=data))
    answer = a.next(what="B's answer on A's t/a subscription")
    expect_msg(answer, "t/a", b"answer", qos)
    check(props_of(answer)[1] == correlation,
          f"the answer carries the Correlation Data: {props_of(answer)}")
    expect_msg(b.next(what="B's own answer on B's t/a subscription"), "t/a", b"answer", qos)
    a.quiet(what="one request and one answer for A")
    b.quiet(what="one request and one answer for B")
    a.disconnect()
    b.disconnect()


def leave_sessions(host, port, topic, ids):
    """What earlier tests of a suite leave for the ids: the first with a persistent
    session subscribed to `topic`, disconnected; the second still connected with one
    (returned, to be taken over by the next CONNECT with its id)."""
    gone = Client(host, port, "v5", ids[0], clean=False, session_expiry=3600)
    gone.subscribe_ok([(topic, 2)])
    gone.disconnect()
    still = Client(host, port, "v5", ids[1], clean=False, session_expiry=3600)
    still.subscribe_ok([(topic, 2)])
    return still


@scenario
def request_response_no_local(host, port, args):
    """Request/response between two MQTT 5 clients on one topic with no-local, as in
    the Paho suites' test_request_response, in the tightest order in which it is due:
    A subscribes T (no-local) and waits for its SUBACK; B subscribes T (no-local) and A
    publishes the request (QoS 1, Response Topic T, Correlation Data) from B's SUBACK
    callback, the moment B's SUBACK is read (the subscription exists once acknowledged;
    a request sent before B's SUBACK, on A's connection, may rightly be routed before
    B's SUBSCRIBE is handled and miss B). B must receive it with T and the
    correlation data unchanged and answers to T at QoS 1 with the properties it
    received, as the suite does; A must receive the answer with them, and neither
    gets its own message back. Each round reconnects the same two client ids with
    clean start; before the first, A has a persistent session subscribed to T and B
    an open connection with one, which B's CONNECT takes over. ARGS: subscription
    QoS (2), rounds (20), T (TopicA)."""
    qos = int(args[0]) if args else 2
    rounds = int(args[1]) if len(args) > 1 else 20
    topic = args[2] if len(args) > 2 else "TopicA"
    ids = ("request response a", "request response b")
    correlation = b"334"
    leftover = leave_sessions(host, port, topic, ids)
    missed = []
    for i in range(rounds):
        a = Client(host, port, "v5", ids[0])
        b = Client(host, port, "v5", ids[1])
        if leftover is not None:
            leftover.c.loop_stop()
            leftover = None
        codes = subscribe_with(a, topic, qos=qos, no_local=True)
        check(codes == [qos], f"round {i}: A's SUBACK for {topic}: {codes}")
        request = f"request {i}".encode()
        sent = []

        def request_at_suback(_c, _u, mid, codes, props, a=a, b=b, sent=sent, request=request):
            # In B's network thread, as soon as B's SUBACK is read.
            if not sent:
                sent.append(a.c.publish(topic, request, 1, False,
                                        publish_props(topic, correlation)))
            b.events.put(("suback", mid, [code.value for code in codes], props))

        def take_or_miss(client, what):
            """The next message, or None with the round counted as missed."""
            try:
                return client.next(what=what)
            except Fail as e:
                missed.append(f"round {i}: {e}")
                a.disconnect()
                b.disconnect()
                if len(missed) == 3:
                    lost(missed, f"{i + 1} (stopped at the third)")
                return None

        b.c.on_subscribe = request_at_suback
        codes = subscribe_with(b, topic, qos=qos, no_local=True)
        check(codes == [qos], f"round {i}: B's SUBACK for {topic}: {codes}")
        check(len(sent) == 1, f"round {i}: the request was not published at B's SUBACK")
        sent[0].wait_for_publish(WAIT)
        _, _, code, _ = a.event("puback", lambda e: e[1] == sent[0].mid)
        check(code < 0x80, f"round {i}: the request was refused: reason {code:#x}")
        got = take_or_miss(b, f"round {i}: the request on B's {topic} subscription")
        if got is None:
            continue
        expect_msg(got, topic, request, 1)
        check(props_of(got) == (topic, correlation),
              f"round {i}: B must get Response Topic {topic!r} and Correlation Data "
              f"{correlation!r}; got {props_of(got)}")
        response_topic, _ = props_of(got)
        b.publish(response_topic, b"response", 1, props=got.properties)
        answer = take_or_miss(a, f"round {i}: B's answer on A's {topic} subscription")
        if answer is None:
            continue
        # A's own request, had it come back, would be ahead of the answer.
        expect_msg(answer, topic, b"response", 1)
        check(props_of(answer) == (topic, correlation),
              f"round {i}: the answer must carry Response Topic {topic!r} and Correlation "
              f"Data {correlation!r}; got {props_of(answer)}")
        last = i == rounds - 1
        b.quiet(QUIET if last else 0.1, what=f"round {i}: nothing more for B (no-local)")
        a.quiet(QUIET if last else 0.1, what=f"round {i}: nothing more for A (no-local)")
        a.disconnect()
        b.disconnect()
    lost(missed, rounds)


def lost(missed, rounds):
    check(not missed, f"{len(missed)} of {rounds} rounds lost a message:\n  "
                      + "\n  ".join(missed))


@scenario
def overlap_one_copy(host, port, args):
    """One connection subscribed to t/a (subscription id 2, QoS 0) and t/a/# (id 3,
    QoS 1): a QoS 1 publish to t/a arrives once, at QoS 1, carrying both ids 2 and 3
    (the one-copy option of MQTT 5 section 3.3.4, with every matching identifier)."""
    sub = Client(host, port, "v5", "oc-sub")
    sub.subscribe_ok([("t/a", 0)], subscription_id=2)
    sub.subscribe_ok([("t/a/#", 1)], subscription_id=3)
    pub = Client(host, port, "v5", "oc-pub")
    pub.publish("t/a", b"once", 1)
    copies = [sub.next(what="t/a")] + sub.drain()
    shape = [describe(m) for m in copies]
    check(len(copies) == 1, f"one copy for the connection's overlapping subscriptions: {shape}")
    expect_msg(copies[0], "t/a", b"once", 1)
    check(sub_ids(copies[0]) == [2, 3], f"the copy carries ids 2 and 3: {shape}")
    pub.publish("t/a/b", b"deeper", 1)
    deeper = sub.next(what="t/a/b")
    expect_msg(deeper, "t/a/b", b"deeper", 1)
    check(sub_ids(deeper) == [3], f"t/a/b matches id 3 only: {describe(deeper)}")
    sub.quiet(what="one copy of each")
    pub.disconnect()
    sub.disconnect()


# How the previous round's connections end before the next round reconnects with the
# same client ids: DISCONNECT, a socket closed without DISCONNECT, or still open (the
# new CONNECT takes the session over).
ENDINGS = ("disconnect", "close", "takeover")


def end(raw, how):
    if how == "disconnect":
        raw.disconnect()
    elif how == "close":
        raw.close()
    # "takeover": left open; the next CONNECT with its client id ends it.


@scenario
def reconnect_then_receive(host, port, args):
    """Many quick reconnects with the same two client ids (clean start), each round
    ending the previous connections another way (DISCONNECT, closed socket, left open
    for a takeover): in every round the subscriber's SUBACK comes first, then the
    publisher's QoS 1 publish, which the subscriber must receive (MQTT 5 section 3.8.4:
    a subscription applies from its SUBACK). The filters alternate between a stored
    topic with no-local, a plain one and a $-topic that is not stored."""
    rounds = int(args[0]) if args else 60
    level = args[1] if len(args) > 1 else "v5"
    v5 = level == "v5"
    previous = []
    missed = []
    for i in range(rounds):
        how = ENDINGS[i % len(ENDINGS)]
        for raw in previous:
            end(raw, how)
        kind = ("no-local", "plain", "dollar")[i % 3]
        topic = {"no-local": "rc/t", "plain": "rc/p", "dollar": "$rc/t"}[kind]
        options = 1 | (0x04 if kind == "no-local" and v5 else 0)
        sub = Raw(host, port, level)
        sub.connect("rc-sub")
        codes = sub.subscribe(1, [(topic, options)])
        check(codes == [1], f"round {i}: SUBACK for {topic}: {codes}")
        pub = Raw(host, port, level)
        pub.connect("rc-pub")
        payload = f"round {i}".encode()
        pub.publish(topic, payload, 1, pid=1)
        ack = pub.read(what=f"round {i}: PUBACK")
        check(ack.kind == PUBACK and ack.pid == 1 and ack.code < 0x80,
              f"round {i}: PUBACK for {topic}: {ack}")
        got = sub.read_or_none(WAIT)
        if got is None or got.kind != PUBLISH or got.payload != payload:
            missed.append(f"round {i} ({kind} {topic}, previous connections ended by "
                          f"{ENDINGS[(i - 1) % len(ENDINGS)] if i else 'nothing'}): got {got}")
        elif got.qos:
            sub.ack(PUBACK, got.pid)
        previous = [sub, pub]
    for raw in previous:
        raw.disconnect()
    check(not missed, f"{len(missed)} of {rounds} rounds lost the publish made right after "
                      f"the SUBACK:\n  " + "\n  ".join(missed))


@scenario
def reconnect_then_receive_paho(host, port, args):
    """reconnect_then_receive with paho-mqtt clients, the way the subscribe-options
    cases run: each round connects the same two client ids (clean start), the
    subscriber subscribes t/a with no-local, the publisher publishes at QoS 1 once the
    SUBACK is in, the subscriber must receive it; both then DISCONNECT (paho closes
    its socket right after sending it, so the server may still be ending the old
    connection when the next round connects)."""
    rounds = int(args[0]) if args else 30
    missed = []
    for i in range(rounds):
        pub = Client(host, port, "v5", "rp-pub")
        sub = Client(host, port, "v5", "rp-sub")
        topic = "$rp/t" if i % 2 else "rp/t"
        codes = subscribe_with(sub, topic, qos=1, no_local=True)
        check(codes == [1], f"round {i}: SUBACK for {topic}: {codes}")
        payload = f"round {i}".encode()
        pub.publish(topic, payload, 1)
        try:
            expect_msg(sub.next(what=f"round {i}: the publish to {topic}"), topic, payload, 1)
        except Fail as e:
            missed.append(f"round {i}: {e}")
        pub.disconnect()
        sub.disconnect()
    check(not missed, f"{len(missed)} of {rounds} rounds lost the publish:\n  "
                      + "\n  ".join(missed))


if __name__ == "__main__":
    sys.exit(run_scenarios(sys.argv, SCENARIOS))
