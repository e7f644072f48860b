#!/usr/bin/env bash
# NATS KV puts and gets from nats-py (benches/natspy_kv.py) against JetStream KV and
# Canopy, each server alone on the machine with a fresh data folder, in turn, ROUNDS
# times:
#
#   cargo build --release -p canopy
#   NATS_SERVER=/path/to/nats-server PYTHON=target/py-venv/bin/python benches/kv.sh [ROUNDS=3] [KEYS=2000] [TASKS=16]
#
# Prints one line per run (put and get rates, p50 and p99). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

export_settings "$@"
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-2000}
TASKS=${TASKS:-16}
NATS_SERVER=${NATS_SERVER:-nats-server}
PYTHON=${PYTHON:-target/py-venv/bin/python}
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
    started $!
    wait_port "$port" "$!" "$label"
    json=$("$PYTHON" benches/natspy_kv.py --server "nats://127.0.0.1:$port" --keys "$KEYS" --tasks "$TASKS")
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
p, g = r["put"], r["get"]
print("round %s  %-8s put %7.0f/s p50 %5d us p99 %6d us   get %7.0f/s p50 %5d us p99 %6d us" % (sys.argv[2], sys.argv[3],
  p["per_sec"], p["p50_ns"] // 1000, p["p99_ns"] // 1000, g["per_sec"], g["p50_ns"] // 1000, g["p99_ns"] // 1000))' "$json" "$round" "$label"
    stop_servers
    rm -rf "$data"
  done
done
