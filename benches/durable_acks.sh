#!/usr/bin/env bash
# Durable publishes from async-nats's JetStream API (benches/asyncnats_durable.rs), each
# awaiting its PubAck, against JetStream and Canopy, each server alone on the machine
# with a fresh data folder, servers in turn within a round:
#
#   cargo build --release -p canopy && cargo bench --bench asyncnats_durable --no-run
#   NATS_SERVER=/path/to/nats-server benches/durable_acks.sh [ROUNDS=3] [BEFORE=/path/to/canopy]
#
# Servers: nats-server -js (file storage, its default sync every 2 min: acks from
# memory), nats-server -js with `sync_interval: always` (an fsync per ack), Canopy
# (the default config: the journal), Canopy with `store.journal = false` (acks from the
# engine's own write-ahead log, as before the journal), and BEFORE if given; with
# SERVERS=..., also canopy-received (every subject stored with durability = "received":
# acked once the journal has the record, before its sync).
# Shapes (SHAPES): one256 (1 connection, 256 in flight, 1,000 subjects), four256
# (4 connections × 256), expect (one256 with Nats-Expected-Last-Subject-Sequence),
# one1 (1 in flight: the latency of one durable publish). nats-js-always gets a tenth
# of MSGS (an fsync per ack is slow enough to time on fewer). Prints one line per run;
# raw JSON to target/bench-durable-acks/runs.jsonl. Loopback only; the client and the
# server share this machine's two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

export_settings "$@"
ROUNDS=${ROUNDS:-3}
MSGS=${MSGS:-200000}
ONE_MSGS=${ONE_MSGS:-3000}
NATS_SERVER=${NATS_SERVER:-nats-server}
AFTER=${AFTER:-target/release/canopy}
BEFORE=${BEFORE:-}
SHAPES=${SHAPES:-one256 four256 expect one1}
SERVERS=${SERVERS:-nats-js nats-js-always canopy canopy-nojournal${BEFORE:+ before}}
BENCH=${ASYNCNATS_DURABLE:-$(ls -t target/release/deps/asyncnats_durable-* 2>/dev/null | grep -v '\.d$' | head -1)}
[[ -x $BENCH ]] || { echo "durable_acks.sh: build it: cargo bench --bench asyncnats_durable --no-run" >&2; exit 1; }

out=target/bench-durable-acks
mkdir -p "$out"
: >"$out/runs.jsonl"
trap stop_servers EXIT INT TERM

start_server() { # label; sets port and data
  local label=$1
  data=$(mktemp -d "$out/data-XXXX")
  port=$(free_port)
  case $label in
    nats-js | nats-js-always)
      local sync=""
      [[ $label == nats-js-always ]] && sync="sync_interval: always"
      printf 'jetstream { store_dir: "%s"\n %s }\n' "$PWD/$data" "$sync" >"$out/nats.conf"
      "$NATS_SERVER" -a 127.0.0.1 -p "$port" -c "$out/nats.conf" >"$out/$label.log" 2>&1 & ;;
    *)
      local binary=$AFTER settings=() config=()
      [[ $label == before ]] && binary=$BEFORE
      [[ $label == canopy-nojournal ]] && settings=(env CANOPY_STORE__JOURNAL=false)
      if [[ $label == canopy-received ]]; then
        printf '[[store.policies]]\npattern = "_INBOX.>"\nstore = false\n\n[[store.policies]]\npattern = ">"\ndurability = "received"\n' >"$out/received.toml"
        config=(--config "$out/received.toml")
      fi
      CANOPY_STORE__URL="file://$PWD/$data" "${settings[@]}" "$binary" serve "${config[@]}" \
        --listen "127.0.0.1:$port" --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
        --log warn >"$out/$label.log" 2>&1 & ;;
  esac
  started $!
  wait_port "$port" "$!" "$label"
}

run() { # label shape
  local msgs=$MSGS
  # An fsync per ack: a tenth of the messages takes long enough.
  [[ $1 == nats-js-always ]] && msgs=$((MSGS / 10))
  local env=(MSGS="$msgs" CONNS=1 IN_FLIGHT=256 SUBJECTS=1000 EXPECT=0)
  case $2 in
    four256) env+=(CONNS=4 SUBJECTS=2000) ;;
    expect) env+=(EXPECT=1) ;;
    one1) env+=(MSGS="$ONE_MSGS" IN_FLIGHT=1) ;;
  esac
  local json
  json=$(env "${env[@]}" SERVER="nats://127.0.0.1:$port" "$BENCH") || json='{"failed":true}'
  printf '{"server":"%s","shape":"%s","result":%s}\n' "$1" "$2" "$json" >>"$out/runs.jsonl"
  python3 -c 'import json, sys
r = json.loads(sys.argv[1])
if r.get("failed"): print("  %-17s %-8s FAILED" % (sys.argv[2], sys.argv[3]))
else: print("  %-17s %-8s %9.0f acks/s  p50 %6d us  p99 %6d us" % (sys.argv[2], sys.argv[3],
  r["acks_per_sec"], r["p50_us"], r["p99_us"]))' "$json" "$1" "$2"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round"
  for shape in $SHAPES; do
    for label in $SERVERS; do
      start_server "$label"
      run "$label" "$shape"
      stop_servers
      rm -rf "$data"
    done
  done
done

python3 - "$out/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rows = {}
for r in runs:
    if r["result"].get("failed"):
        continue
    rows.setdefault((r["shape"], r["server"]), []).append(r["result"])
print("\nmedians (acks/s, p50 µs, p99 µs):")
for (shape, server), results in sorted(rows.items()):
    med = lambda k: statistics.median(x[k] for x in results)
    print("  %-8s %-17s %9.0f  %6.0f  %6.0f  (%d runs)" % (shape, server, med("acks_per_sec"),
          med("p50_us"), med("p99_us"), len(results)))
EOF
