#!/usr/bin/env bash
# Creating tenants (issue 7): COUNT (default 10,000) creations through the HTTP API
# (`POST /api/tenants`, CONCURRENCY keep-alive connections, default 8) against a release
# build storing on a fresh folder; prints the creation rate, the per-creation latency,
# and the server's memory per idle tenant (VmRSS after minus before, over COUNT).
# Every creation is a durable write answered after the store holds it.
#
#   benches/tenants.sh
#   COUNT=1000 benches/tenants.sh
#
# Loopback only; only the server this script started is stopped, by PID. The load
# (Python threads) and the server share this machine's two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

COUNT=${COUNT:-10000}
CONCURRENCY=${CONCURRENCY:-8}
cargo build --release --quiet
canopy=${CARGO_TARGET_DIR:-target}/release/canopy
out=target/bench-tenants
mkdir -p "$out"
rm -rf "$out/store"
trap stop_servers EXIT
native=$(free_port) http=$(free_port)
CANOPY_STORE__URL="file://$PWD/$out/store" "$canopy" serve --listen "127.0.0.1:$native" \
  --http-listen "127.0.0.1:$http" --log warn >"$out/canopy.log" 2>&1 &
pid=$!
started "$pid"
wait_port "$http" "$pid" canopy
sleep 1
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$pid/status"; }
before=$(rss)
python3 - "$http" "$COUNT" "$CONCURRENCY" <<'PY'
import http.client, json, sys, threading, time
port, count, workers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
latencies, failures, lock = [], [], threading.Lock()
def work(first):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(first, count, workers):
        body = json.dumps({"name": f"tenant-{i}"})
        started = time.perf_counter()
        conn.request("POST", "/api/tenants", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)
            if response.status != 200:
                failures.append(response.status)
start = time.perf_counter()
threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
for t in threads: t.start()
for t in threads: t.join()
total = time.perf_counter() - start
latencies.sort()
pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
print(f"created {len(latencies) - len(failures)} tenants in {total:.2f} s: "
      f"{len(latencies) / total:.0f}/s; latency p50 {pick(0.5):.2f} ms, p99 {pick(0.99):.2f} ms"
      + (f"; FAILED: {len(failures)}" if failures else ""))
sys.exit(1 if failures else 0)
PY
sleep 1
after=$(rss)
echo "server memory: $before B before, $after B after: $(( (after - before) / COUNT )) B per idle tenant"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
