#!/usr/bin/env bash
# What `[cluster]` costs one node (issue 28; goal: within 10%): benches/compare.sh with
# BEFORE a Canopy alone on an S3-compatible server (moto) and AFTER the same binary as
# the only node of a cluster (Debian's etcd, the same S3 server, the default 16 shards
# and 5 s lease), every shape of compare.sh, its anchors (nats-server, Mosquitto) in
# the same run. Both sides store every subject, as the default config does; each run
# gets a fresh S3 prefix (and cluster name) of its own.
#
#   cargo build --release -p canopy -p canopy-bench
#   PYTHON=target/py-venv/bin/python benches/cluster_cost.sh [ROUNDS=3] [SCALE=1] [SHAPES=...]
#   ... benches/cluster_cost.sh SHARDS=1   # the cluster with one shard: its own cost, without
#                                          # sixteen stores' background work
#
# PYTHON is a Python with moto[server] (scripts/test-all.sh makes target/py-venv);
# etcd comes from PATH. Both are started here on free loopback ports and stopped (by
# PID) at the end. Results go where compare.sh puts them ($OUT/compare, default
# target/bench-cluster-cost/compare).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case $arg in
    ROUNDS=* | SCALE=* | SHAPES=* | NATSPY=* | SHARDS=*) export "${arg?}" ;;
    *) echo "cluster_cost.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
out=${OUT:-target/bench-cluster-cost}
rm -rf "$out"
mkdir -p "$out"
PYTHON=${PYTHON:-target/py-venv/bin/python}
canopy=$(realpath target/release/canopy)
bench=$(realpath target/release/canopy-bench)

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

services=()
stop_services() {
  for pid in "${services[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${services[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_services EXIT

s3=$(free_port)
"$(dirname "$PYTHON")/moto_server" -H 127.0.0.1 -p "$s3" >"$out/moto.log" 2>&1 &
services+=($!)
etcd_client=$(free_port) etcd_peer=$(free_port)
etcd --name cost --data-dir "$out/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "cost=http://127.0.0.1:$etcd_peer" >"$out/etcd.log" 2>&1 &
services+=($!)
for _ in $(seq 1 100); do
  if "$PYTHON" -c "import urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$s3/bench', method='PUT'), timeout=1)" 2>/dev/null \
    && "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$etcd_client/version', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.1
done

# The two sides: the same binary, replaced by `exec` so that compare.sh measures the
# server's own process; the store URL compare.sh gives (a fresh folder per run)
# becomes a fresh S3 prefix.
s3_env="export CANOPY_STORE__S3__ENDPOINT=http://127.0.0.1:$s3 CANOPY_STORE__S3__REGION=us-east-1 \
CANOPY_STORE__S3__ACCESS_KEY_ID=bench CANOPY_STORE__S3__SECRET_ACCESS_KEY=bench \
CANOPY_STORE__S3__ALLOW_HTTP=true CANOPY_STORE__S3__PATH_STYLE=true"
cat >"$out/alone" <<EOF
#!/bin/sh
export CANOPY_STORE__URL="s3://bench/alone-\$(basename "\$CANOPY_STORE__URL")-\$\$"
$s3_env
exec "$canopy" "\$@"
EOF
cat >"$out/clustered" <<EOF
#!/bin/sh
export CANOPY_STORE__URL="s3://bench/clustered-\$(basename "\$CANOPY_STORE__URL")-\$\$"
$s3_env
export CANOPY_CLUSTER__ETCD='["http://127.0.0.1:$etcd_client"]' CANOPY_CLUSTER__NAME="cost\$\$" \
CANOPY_CLUSTER__NODE_ID=solo CANOPY_CLUSTER__LISTEN=127.0.0.1:0 CANOPY_CLUSTER__SHARDS=${SHARDS:-16}
exec "$canopy" "\$@"
EOF
chmod +x "$out/alone" "$out/clustered"
OUT="$out/compare" BENCH="$bench" benches/compare.sh BEFORE="$out/alone" AFTER="$out/clustered"
