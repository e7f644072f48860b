#!/usr/bin/env bash
# NATS KV puts and gets from nats-py (benches/natspy_kv.py) and async-nats
# (benches/asyncnats_kv.rs, which also times a watch of WATCH_KEYS keys: to the first
# and to the last initial value, and the server's memory growth meanwhile) against
# JetStream KV and Canopy, each server alone on the machine with a fresh data folder,
# in turn, ROUNDS times:
#
#   cargo build --release -p canopy && cargo bench --bench asyncnats_kv --no-run
#   NATS_SERVER=/path/to/nats-server PYTHON=target/py-venv/bin/python benches/kv.sh \
#     [ROUNDS=3] [KEYS=2000] [TASKS=16] [WATCH_KEYS=100000]
#
# Prints one line per run and client (put and get rates, p50 and p99; the watch).
# Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

export_settings "$@"
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-2000}
TASKS=${TASKS:-16}
NATS_SERVER=${NATS_SERVER:-nats-server}
PYTHON=${PYTHON:-target/py-venv/bin/python}
WATCH_KEYS=${WATCH_KEYS:-100000}
BENCH=${ASYNCNATS_KV:-$(ls -t target/release/deps/asyncnats_kv-* 2>/dev/null | grep -v '\.d$' | head -1)}
[[ -x $BENCH ]] || { echo "kv.sh: build it: cargo bench --bench asyncnats_kv --no-run" >&2; exit 1; }
out=target/bench-kv
mkdir -p "$out"
trap stop_servers EXIT INT TERM

for round in $(seq 1 "$ROUNDS"); do
  for label in nats-js canopy; do
    data=$(mktemp -d "$out/data-XXXX")
    port=$(free_port)
    if [[ $label == nats-js ]]; then
      "$NATS_SERVER" -a 127.0.0.1 -p "$port" -js -sd "$data" >"$out/$label.log" 2>&1 &
    else
      CANOPY_STORE__URL="file://$PWD/$data" target/release/canopy serve --listen "127.0.0.1:$port" \
        --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >"$out/$label.log" 2>&1 &
    fi
    pid=$!
    started "$pid"
    wait_port "$port" "$pid" "$label"
    json=$("$PYTHON" benches/natspy_kv.py --server "nats://127.0.0.1:$port" --keys "$KEYS" --tasks "$TASKS")
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
p, g = r["put"], r["get"]
print("round %s  %-8s nats-py     put %7.0f/s p50 %5d us p99 %6d us   get %7.0f/s p50 %5d us p99 %6d us" % (sys.argv[2], sys.argv[3],
  p["per_sec"], p["p50_ns"] // 1000, p["p99_ns"] // 1000, g["per_sec"], g["p50_ns"] // 1000, g["p99_ns"] // 1000))' "$json" "$round" "$label"
    json=$(SERVER="nats://127.0.0.1:$port" KEYS="$KEYS" IN_FLIGHT="$TASKS" WATCH_KEYS="$WATCH_KEYS" \
      SERVER_PID="$pid" "$BENCH")
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
p, g, w = r["put"], r["get"], r["watch"]
print("round %s  %-8s async-nats  put %7.0f/s p50 %5d us p99 %6d us   get %7.0f/s p50 %5d us p99 %6d us" % (sys.argv[2], sys.argv[3],
  p["per_sec"], p["p50_us"], p["p99_us"], g["per_sec"], g["p50_us"], g["p99_us"]))
if w:
  print("round %s  %-8s async-nats  watch of %d keys: first %.1f ms, all %.1f ms, RSS %d MiB before, +%d MiB" % (sys.argv[2], sys.argv[3],
    w["keys"], w["first_ms"], w["all_ms"], w["rss_before_kib"] // 1024, w["rss_growth_kib"] // 1024))' "$json" "$round" "$label"
    stop_servers
    rm -rf "$data"
  done
done
