"""A three-node Canopy cluster on loopback (Debian's etcd, moto's S3 server), measured
with nats-py (a client from another project):

  - takeover: kill -9 the node owning the default tenant's shard, time until another
    node owns it (as `canopy cluster status` shows), restart the killed node, repeat;
  - hop: the ack latency of stored publishes (one in flight; `Canopy-Ack: received`,
    where the store's own latency is smallest, and `durable`, which waits for the
    write-ahead log's PUT to S3) through the shard's owner and through a node that
    forwards them to it;
  - fan-out: subscribers on every node, stored publishes through a non-owner; the
    messages the owner sends to other nodes per publish (goal: one per interested
    node) and the deliveries per second seen by all subscribers together; then, the
    cluster stopped, the same clients against one node without `[cluster]` on the
    same S3 server (its own prefix), for the cluster's rate against one node's.

    PYTHON=target/py-venv/bin/python
    $PYTHON benches/cluster.py [--canopy target/release/canopy] [--kills 20]
    $PYTHON benches/cluster.py --figures fanout --fan 20000 --rounds 3

Prints one JSON line per figure and writes them to target/bench-out/cluster.jsonl.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import nats

SHARDS = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stable_hash(data: bytes) -> int:
    """cluster::share's hash: FNV-1a then a finaliser, on 64 bits."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    return h ^ (h >> 33)


def shard_of(tenant: str) -> int:
    return stable_hash(tenant.encode()) % SHARDS


class Cluster:
    def __init__(self, canopy, lease):
        self.canopy = os.path.abspath(canopy)
        self.lease = lease
        self.dir = tempfile.mkdtemp(prefix="canopy-cluster-bench-")
        self.name = f"bench{os.getpid()}"
        self.procs = {}
        self.ports = {n: (free_port(), free_port(), free_port()) for n in "abc"}
        s3 = free_port()
        venv_bin = os.path.dirname(sys.executable)
        self.moto = subprocess.Popen(
            [os.path.join(venv_bin, "moto_server"), "-H", "127.0.0.1", "-p", str(s3)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", os.path.join(self.dir, "etcd"),
             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.s3 = f"http://127.0.0.1:{s3}"
        for _ in range(100):
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.s3}/bench", method="PUT"),
                                       timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        try:
            for node in "abc":
                self.start(node)
        except BaseException:
            self.stop()
            raise

    def env(self, node):
        env = dict(os.environ)
        env.update({
            "CANOPY_STORE__URL": f"s3://bench/{self.name}",
            "CANOPY_STORE__S3__ENDPOINT": self.s3,
            "CANOPY_STORE__S3__REGION": "us-east-1",
            "CANOPY_STORE__S3__ACCESS_KEY_ID": "bench",
            "CANOPY_STORE__S3__SECRET_ACCESS_KEY": "bench",
            "CANOPY_STORE__S3__ALLOW_HTTP": "true",
            "CANOPY_STORE__S3__PATH_STYLE": "true",
            "CANOPY_CLUSTER__ETCD": json.dumps([self.etcd_url]),
            "CANOPY_CLUSTER__NAME": self.name,
            "CANOPY_CLUSTER__NODE_ID": node,
            "CANOPY_CLUSTER__SHARDS": str(SHARDS),
            "CANOPY_CLUSTER__LEASE_SECS": str(self.lease),
            "CANOPY_CLUSTER__LISTEN": f"127.0.0.1:{self.ports[node][2]}",
        })
        env.pop("RUST_LOG", None)
        return env

    def start(self, node):
        native, http, _ = self.ports[node]
        log = open(os.path.join(self.dir, f"{node}.log"), "ab")
        self.procs[node] = subprocess.Popen(
            [self.canopy, "serve", "--listen", f"127.0.0.1:{native}",
             "--mqtt-listen", "127.0.0.1:0", "--http-listen", f"127.0.0.1:{http}"],
            env=self.env(node), stdout=subprocess.DEVNULL, stderr=log, cwd=self.dir)

    def url(self, node):
        return f"nats://127.0.0.1:{self.ports[node][0]}"

    def status(self):
        out = subprocess.run([self.canopy, "cluster", "status", "--json", "--etcd", self.etcd_url,
                              "--name", self.name], capture_output=True, check=True)
        return json.loads(out.stdout)

    def owner(self, tenant="default"):
        owners = self.status()["owners"]
        return owners[shard_of(tenant)]["owner"] if owners else None

    def settled(self, nodes, timeout=60):
        until = time.time() + timeout
        while time.time() < until:
            status = self.status()
            shares = sorted(n["shards"] for n in status["nodes"])
            ids = sorted(n["id"] for n in status["nodes"])
            owned = [o for o in status["owners"] if o["owner"]]
            fair = [SHARDS // len(nodes) + (1 if i < SHARDS % len(nodes) else 0)
                    for i in range(len(nodes))]
            if ids == sorted(nodes) and len(owned) == SHARDS and shares == sorted(fair):
                return
            time.sleep(0.05)
        raise RuntimeError(f"not settled: {self.status()}")

    def metrics(self, node):
        page = urllib.request.urlopen(f"http://127.0.0.1:{self.ports[node][1]}/metrics",
                                      timeout=5).read().decode()
        return {line.split(" ")[0]: float(line.split(" ")[1])
                for line in page.splitlines()
                if line and not line.startswith("#") and " " in line and "{" not in line}

    def stop_nodes(self):
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = {}

    def start_single(self, prefix):
        """One node without `[cluster]` on the same S3 server, under its own prefix;
        returns its NATS URL. Stopped by stop_nodes."""
        native, http = free_port(), free_port()
        env = {k: v for k, v in self.env("a").items() if not k.startswith("CANOPY_CLUSTER__")}
        env["CANOPY_STORE__URL"] = f"s3://bench/{prefix}"
        log = open(os.path.join(self.dir, "single.log"), "ab")
        self.procs["single"] = subprocess.Popen(
            [self.canopy, "serve", "--listen", f"127.0.0.1:{native}",
             "--mqtt-listen", "127.0.0.1:0", "--http-listen", f"127.0.0.1:{http}"],
            env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=self.dir)
        until = time.time() + 30
        while time.time() < until:
            try:
                socket.create_connection(("127.0.0.1", native), timeout=1).close()
                return f"nats://127.0.0.1:{native}"
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the single node did not start")

    def stop(self):
        self.stop_nodes()
        for proc in (self.etcd, self.moto):
            proc.terminate()
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def takeover(cluster, kills):
    times = []
    for _ in range(kills):
        cluster.settled("abc")
        owner = cluster.owner()
        killed = time.monotonic()
        cluster.procs[owner].kill()
        cluster.procs[owner].wait()
        while True:
            now = cluster.owner()
            if now and now != owner:
                break
            time.sleep(0.02)
        times.append(time.monotonic() - killed)
        cluster.start(owner)
    return times


async def acked_latencies(url, subject, count, ack):
    nc = await nats.connect(url)
    lat = []
    for i in range(count):
        start = time.perf_counter()
        msg = await nc.request(subject, b"x" * 100, timeout=10, headers={"Canopy-Ack": ack})
        lat.append(time.perf_counter() - start)
        if b'"version"' not in msg.data:
            raise RuntimeError(msg.data)
    await nc.close()
    lat.sort()
    return lat


def pct(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


async def hop(cluster, count):
    cluster.settled("abc")
    owner = cluster.owner()
    other = next(n for n in "abc" if n != owner)
    rows = []
    for ack in ("received", "durable"):
        for rnd in range(2):
            for via, node in (("owner", owner), ("non-owner", other)):
                lat = await acked_latencies(cluster.url(node), f"hop.{via}.{rnd}", count, ack)
                rows.append({"figure": "hop", "ack": ack, "via": via, "round": rnd, "n": count,
                             "p50_us": round(pct(lat, 0.5) * 1e6),
                             "p99_us": round(pct(lat, 0.99) * 1e6)})
    return rows


async def fan(sub_urls, pub_url, count):
    """One subscriber on `fan.>` at each of `sub_urls`, `count` acked stored
    publishes (256 in flight) through `pub_url`; deliveries per second, all
    subscribers together."""
    subs, received = [], [0]
    done = asyncio.Event()
    expected = count * len(sub_urls)

    async def on_message(_msg):
        received[0] += 1
        if received[0] == expected:
            done.set()

    for url in sub_urls:
        nc = await nats.connect(url)
        await nc.subscribe("fan.>", cb=on_message)
        await nc.flush()
        subs.append(nc)
    await asyncio.sleep(1.0)  # interest reaches every node
    pub = await nats.connect(pub_url)
    start = time.perf_counter()
    window = 256
    pending = []
    for i in range(count):
        pending.append(pub.request(f"fan.{i % 100}", b"y" * 100, timeout=30,
                                   headers={"Canopy-Ack": "durable"}))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.perf_counter() - start
    for nc in subs + [pub]:
        await nc.close()
    return round(expected / elapsed)


async def fanout(cluster, count):
    cluster.settled("abc")
    owner = cluster.owner()
    other = next(n for n in "abc" if n != owner)
    before = cluster.metrics(owner).get("canopy_cluster_messages_sent_total", 0.0)
    delivered = await fan([cluster.url(n) for n in "abc"], cluster.url(other), count)
    after = cluster.metrics(owner).get("canopy_cluster_messages_sent_total", 0.0)
    return {"figure": "fanout", "published": count, "subscribers_per_node": 1, "nodes": 3,
            "node_messages_per_publish": round((after - before) / count, 3),
            "delivered_per_sec": delivered}


def single_fanout(cluster, count, rnd):
    """The fan-out's clients against one node without `[cluster]`: three subscribers
    and the publisher on it. Run with the cluster's nodes stopped."""
    url = cluster.start_single(f"single-{os.getpid()}-{rnd}")
    try:
        delivered = asyncio.run(fan([url, url, url], url, count))
    finally:
        cluster.stop_nodes()
    return {"figure": "fanout-one-node", "published": count, "subscribers": 3,
            "delivered_per_sec": delivered}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--canopy", default="target/release/canopy")
    parser.add_argument("--figures", default="hop,fanout,takeover")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease", type=int, default=5)
    parser.add_argument("--acks", type=int, default=2000)
    parser.add_argument("--fan", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1, help="fan-out rounds")
    args = parser.parse_args()
    figures = set(args.figures.split(","))
    os.makedirs("target/bench-out", exist_ok=True)
    rows = []
    cluster = Cluster(args.canopy, args.lease)
    try:
        for rnd in range(args.rounds if "fanout" in figures else 0):
            if not cluster.procs:
                for node in "abc":
                    cluster.start(node)
            cluster.settled("abc", timeout=120)
            rows.append(dict(asyncio.run(fanout(cluster, args.fan)), round=rnd))
            # Each server alone on the machine: the cluster stops before one node runs.
            cluster.stop_nodes()
            rows.append(dict(single_fanout(cluster, args.fan, rnd), round=rnd))
        if figures & {"hop", "takeover"}:
            if not cluster.procs:
                for node in "abc":
                    cluster.start(node)
            cluster.settled("abc", timeout=120)
        if "hop" in figures:
            rows += asyncio.run(hop(cluster, args.acks))
        if "takeover" in figures:
            times = takeover(cluster, args.kills)
            rows.append({"figure": "takeover", "kills": len(times), "lease_secs": args.lease,
                         "median_s": round(statistics.median(times), 2),
                         "max_s": round(max(times), 2), "all_s": [round(t, 2) for t in times]})
    finally:
        cluster.stop()
    with open("target/bench-out/cluster.jsonl", "w") as out:
        for row in rows:
            line = json.dumps(row)
            print(line)
            out.write(line + "\n")


if __name__ == "__main__":
    main()
