#!/usr/bin/env bash
# Live pub/sub load: the same client (`canopy bench`) against Canopy and against
# nats-server on this machine, every shape, alternating servers, ROUNDS rounds, medians.
#
#   benches/live.sh                 # full sizes (a few seconds per run)
#   ROUNDS=1 SCALE=10 benches/live.sh   # quick look: a tenth of the messages, one round
#
# Needs nats-server on PATH (Debian: apt-get install nats-server). Loopback only. The
# load tool and both servers share this machine's CPUs: say so with the numbers.
# Raw JSON of every run goes to target/bench-live/runs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-1}
NATS_SERVER=${NATS_SERVER:-nats-server}

# name | shape | messages | extra flags
RUNS=(
  "pubsub|pubsub|$((1000000 / SCALE))|"
  "fanin|fanin|$((1000000 / SCALE))|"
  "fanout|fanout|$((300000 / SCALE))|"
  "reqrep w=1|reqrep|$((50000 / SCALE))|--window 1"
  "reqrep w=64|reqrep|$((500000 / SCALE))|--window 64"
)

command -v "$NATS_SERVER" >/dev/null || { echo "live.sh: $NATS_SERVER not found" >&2; exit 1; }
# `canopy bench` runs canopy-bench, built beside canopy.
cargo build --release --quiet -p canopy -p canopy-bench
canopy=${CARGO_TARGET_DIR:-target}/release/canopy
out=target/bench-live
mkdir -p "$out"
: >"$out/runs.jsonl"

trap stop_servers EXIT INT TERM

nats_port=$(free_port)
"$NATS_SERVER" -a 127.0.0.1 -p "$nats_port" >"$out/nats-server.log" 2>&1 &
started $!
wait_port "$nats_port" "$!" nats-server

canopy_port=$(free_port)
"$canopy" serve --listen "127.0.0.1:$canopy_port" --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >"$out/canopy.log" 2>&1 &
started $!
wait_port "$canopy_port" "$!" canopy

echo "live.sh: $(nproc) CPUs shared by the load tool and the server under test;" \
  "$ROUNDS rounds, servers alternating; $($NATS_SERVER --version)" >&2

bench() { # server-label port name shape msgs extra...
  local label=$1 port=$2 name=$3 shape=$4 msgs=$5
  shift 5
  local json
  json=$("$canopy" bench --server "nats://127.0.0.1:$port" --shape "$shape" --msgs "$msgs" \
    --size 128 --json "$@")
  printf '{"server_label":"%s","run":"%s","result":%s}\n' "$label" "$name" "$json" >>"$out/runs.jsonl"
  python3 -c 'import json, sys
r = json.loads(sys.argv[1]); lat = r["latency"]
print("  %-12s %-12s %12.0f msgs/s  p50 %.1f us  p99 %.1f us" % (sys.argv[2], sys.argv[3],
      r["msgs_per_sec"], lat["p50_ns"] / 1e3, lat["p99_ns"] / 1e3), file=sys.stderr)' \
    "$json" "$name" "$label"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for run in "${RUNS[@]}"; do
    IFS='|' read -r name shape msgs extra <<<"$run"
    # shellcheck disable=SC2086 # extra is a list of flags
    if (( round % 2 )); then
      bench canopy "$canopy_port" "$name" "$shape" "$msgs" $extra
      bench nats-server "$nats_port" "$name" "$shape" "$msgs" $extra
    else
      bench nats-server "$nats_port" "$name" "$shape" "$msgs" $extra
      bench canopy "$canopy_port" "$name" "$shape" "$msgs" $extra
    fi
  done
done

python3 - "$out/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
order, table = [], {}
for r in runs:
    if r["run"] not in order:
        order.append(r["run"])
    table.setdefault((r["run"], r["server_label"]), []).append(r["result"])

def med(results, key):
    return statistics.median(key(r) for r in results)

def us(ns):
    return f"{ns / 1e3:,.0f}" if ns >= 10_000 else f"{ns / 1e3:,.1f}"

print("| shape | canopy msgs/s | nats-server msgs/s | ratio | canopy p50/p99 µs | nats p50/p99 µs |")
print("|---|---:|---:|---:|---:|---:|")
for name in order:
    c, n = table[(name, "canopy")], table[(name, "nats-server")]
    cr, nr = med(c, lambda r: r["msgs_per_sec"]), med(n, lambda r: r["msgs_per_sec"])
    lat = lambda rs: f'{us(med(rs, lambda r: r["latency"]["p50_ns"]))} / {us(med(rs, lambda r: r["latency"]["p99_ns"]))}'
    print(f"| {name} | {cr:,.0f} | {nr:,.0f} | {cr / nr:.2f} | {lat(c)} | {lat(n)} |")
PY
