#!/usr/bin/env bash
# Fan-in with clients from other projects: many publishers, as fast as the server
# takes them, into one subscriber that cannot keep up with all of them, where a server
# must either slow its publishers or cut the subscriber (and lose messages).
#
#   NATS_SERVER=... PYTHON=target/py-venv/bin/python benches/fanin.sh [BEFORE=/path/to/canopy]
#
# Per round, each server alone on the machine with a fresh data folder:
#   - native: benches/natspy_fanin.py (nats-py): 10 publisher processes, NATS_MSGS
#     messages of 100 bytes in all over 1,000 subjects, 1 subscriber on `bench.f.>`;
#     against nats-server ($NATS_SERVER, no JetStream), Canopy storing on (the default
#     config), Canopy storing off (CANOPY_STORE__POLICIES=[]) and, with BEFORE, the same
#     two of an earlier Canopy build;
#   - native-rust: the same with async-nats (benches/asyncnats_fanin.rs, built by
#     `cargo bench --bench asyncnats_fanin --no-run`; ASYNCNATS_FANIN names the binary),
#     RUST_MSGS messages: fast enough to outrun one subscriber;
#   - MQTT: Mosquitto's own tools: 10 `mosquitto_pub -q 1 -l` publishers of MQTT_MSGS
#     lines in all (100 bytes each, one topic per publisher), 1 `mosquitto_sub -q 1` on
#     `bench/f/#`, timed until it received them all (at most 60 s); against Mosquitto
#     ($MOSQUITTO, in memory, no queue limit) and the same Canopy configurations.
# Prints one line per run: rate, delivered and lost. Loopback only; the clients and the
# server share this machine's CPUs. Raw results go to target/bench-fanin/runs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

export_settings "$@"
ROUNDS=${ROUNDS:-3}
NATS_MSGS=${NATS_MSGS:-1000000}
MQTT_MSGS=${MQTT_MSGS:-200000}
RUST_MSGS=${RUST_MSGS:-1000000}
ASYNCNATS_FANIN=${ASYNCNATS_FANIN:-$(ls -t target/release/deps/asyncnats_fanin-* 2>/dev/null | grep -v '\.d$' | head -1)}
PUBLISHERS=10
NATS_SERVER=${NATS_SERVER:-nats-server}
MOSQUITTO=${MOSQUITTO:-/usr/sbin/mosquitto}
PYTHON=${PYTHON:-target/py-venv/bin/python}
AFTER=${AFTER:-target/release/canopy}
BEFORE=${BEFORE:-}
SHAPES=${SHAPES:-native-rust native mqtt}

out=target/bench-fanin
mkdir -p "$out"
: >"$out/runs.jsonl"
trap stop_servers EXIT INT TERM

# Starts one server alone; sets `port` (native or MQTT, as `kind` says) and `data`.
start_server() { # label kind
  local label=$1 kind=$2 native mqtt
  data=$(mktemp -d "$out/data-XXXX")
  native=$(free_port)
  mqtt=$(free_port)
  case $label in
    nats-server)
      "$NATS_SERVER" -a 127.0.0.1 -p "$native" >"$out/$label.log" 2>&1 &
      started $!; wait_port "$native" "$!" "$label"; port=$native ;;
    mosquitto)
      printf 'listener %s 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\nmax_queued_messages 0\nmax_inflight_messages 64\npersistence false\n' \
        "$mqtt" >"$out/mosquitto.conf"
      "$MOSQUITTO" -c "$out/mosquitto.conf" >"$out/$label.log" 2>&1 &
      started $!; wait_port "$mqtt" "$!" "$label"; port=$mqtt ;;
    *)
      local binary=$AFTER storing=()
      [[ $label == before-* ]] && binary=$BEFORE
      [[ $label == *-off ]] && storing=(env CANOPY_STORE__POLICIES=[])
      CANOPY_STORE__URL="file://$PWD/$data" "${storing[@]}" "$binary" serve --listen "127.0.0.1:$native" \
        --mqtt-listen "127.0.0.1:$mqtt" --http-listen 127.0.0.1:0 --log warn >"$out/$label.log" 2>&1 &
      started $!
      wait_port "$native" "$!" "$label"
      if [[ $kind == mqtt ]]; then port=$mqtt; else port=$native; fi ;;
  esac
}

native_run() { # label kind
  local json
  if [[ $2 == native-rust ]]; then
    json=$(SERVER="nats://127.0.0.1:$port" MSGS=$RUST_MSGS PUBLISHERS=$PUBLISHERS SIZE=100 \
      SUBJECTS=1000 "$ASYNCNATS_FANIN") || json='{"failed":true}'
  else
    json=$("$PYTHON" benches/natspy_fanin.py --server "nats://127.0.0.1:$port" \
      --msgs "$NATS_MSGS" --publishers "$PUBLISHERS" --size 100 --subjects 1000) || json='{"failed":true}'
  fi
  printf '{"server":"%s","shape":"%s","result":%s}\n' "$1" "$2" "$json" >>"$out/runs.jsonl"
  python3 -c 'import json, sys
r = json.loads(sys.argv[1])
if r.get("failed"): print("  %-16s %-11s FAILED" % (sys.argv[2], sys.argv[3]))
else: print("  %-16s %-11s %10.0f msgs/s  delivered %d  lost %d%s" % (sys.argv[2], sys.argv[3],
  r["msgs_per_sec"], r["delivered"], r["lost"], "  (subscriber cut)" if r["cut"] else ""))' "$json" "$1" "$2"
}

mqtt_run() { # label
  local each=$((MQTT_MSGS / PUBLISHERS)) start end got pubs=()
  python3 -c 'import sys; line = "x" * 100 + "\n"; sys.stdout.write(line * int(sys.argv[1]))' "$each" >"$out/lines"
  timeout 60 mosquitto_sub -h 127.0.0.1 -p "$port" -q 1 -i fanin-sub -t 'bench/f/#' \
    -C "$MQTT_MSGS" >"$out/received" 2>"$out/sub.err" &
  local sub=$!
  sleep 1 # subscribed
  start=$(date +%s.%N)
  for p in $(seq 1 "$PUBLISHERS"); do
    mosquitto_pub -h 127.0.0.1 -p "$port" -q 1 -i "fanin-pub-$p" -t "bench/f/$p" -l <"$out/lines" &
    pubs+=($!)
  done
  for pid in "${pubs[@]}"; do wait "$pid" || true; done
  wait "$sub" || true
  end=$(date +%s.%N)
  got=$(wc -l <"$out/received")
  printf '{"server":"%s","shape":"mqtt-qos1","delivered":%d,"lost":%d,"seconds":%s}\n' \
    "$1" "$got" $((MQTT_MSGS - got)) "$(echo "$end - $start" | bc)" >>"$out/runs.jsonl"
  printf '  %-16s mqtt-qos1   %10.0f msgs/s  delivered %d  lost %d\n' "$1" \
    "$(echo "$got / ($end - $start)" | bc -l)" "$got" $((MQTT_MSGS - got))
}

labels_for() { # kind
  local anchor=nats-server
  [[ $1 == mqtt ]] && anchor=mosquitto
  echo "$anchor canopy-on canopy-off${BEFORE:+ before-on before-off}"
}

echo "fanin.sh: $(nproc) CPUs shared by clients and server; $ROUNDS rounds" >&2
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for kind in $SHAPES; do
    for label in $(labels_for "$kind"); do
      start_server "$label" "$kind"
      if [[ $kind == mqtt ]]; then mqtt_run "$label"; else native_run "$label" "$kind"; fi
      stop_servers
      rm -rf "$data"
    done
  done
done
