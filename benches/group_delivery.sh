#!/usr/bin/env bash
# Consumer-group delivery through nats-py's JetStream pull consumer (a client from
# another project), Canopy against nats-server -js, each server alone on the machine
# with a fresh data folder, in rounds:
#   - rate: benches/natspy_groups.py --api jetstream (4 members, --msgs over --subjects)
#   - CPU:  benches/natspy_ackcost.py (server CPU per delivered and acked message)
#
#   NATS_SERVER=/path/to/nats-server PYTHON=/path/to/python \
#     benches/group_delivery.sh [canopy binary ...]
#
# Every canopy binary given is measured (default: target/release/canopy), so a build
# before and after a change run in the same rounds. Env: ROUNDS (2), MSGS (200000),
# SUBJECTS (100000), ACKS (100000). Prints one line per run and writes them to
# target/bench-out/group_delivery.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NATS_SERVER:?set NATS_SERVER to a nats-server 2.15.1 binary}"
: "${PYTHON:?set PYTHON to a python with nats-py}"
ROUNDS=${ROUNDS:-2}
MSGS=${MSGS:-200000}
SUBJECTS=${SUBJECTS:-100000}
ACKS=${ACKS:-100000}
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(target/release/canopy)
out=target/bench-out
mkdir -p "$out"
results="$out/group_delivery.jsonl"
: >"$results"
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() { # port
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "group_delivery: nothing listens on $1" >&2
  return 1
}

start() { # label binary
  rm -rf "$tmp/data" && mkdir -p "$tmp/data"
  port=$(free_port)
  if [ "$1" = nats-server ]; then
    "$NATS_SERVER" -js -sd "$tmp/data" -a 127.0.0.1 -p "$port" >"$out/$1.log" 2>&1 &
  else
    CANOPY_STORE__URL="file://$tmp/data" "$2" serve --listen "127.0.0.1:$port" \
      --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >"$out/canopy.log" 2>&1 &
  fi
  pid=$!
  wait_port "$port"
}

stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
}

run() { # label binary
  start "$1" "$2"
  rate=$("$PYTHON" benches/natspy_groups.py --server "nats://127.0.0.1:$port" --api jetstream \
    --msgs "$MSGS" --subjects "$SUBJECTS" | tail -1)
  stop
  start "$1" "$2"
  cpu=$("$PYTHON" benches/natspy_ackcost.py --server "nats://127.0.0.1:$port" --pid "$pid" \
    --subjects "$SUBJECTS" --acks "$ACKS" | tail -1)
  stop
  line="{\"server\": \"$1\", \"binary\": \"$2\", \"rate\": $rate, \"cpu\": $cpu}"
  echo "$line" | tee -a "$results"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round" >&2
  run nats-server "$NATS_SERVER"
  for binary in "${binaries[@]}"; do
    run canopy "$binary"
  done
done
