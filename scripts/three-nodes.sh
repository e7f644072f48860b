#!/usr/bin/env bash
# Starts a three-node Canopy cluster on this machine until Ctrl-C: one etcd, one
# S3-compatible server (moto's, in target/py-venv) and three `canopy serve`, nodes a,
# b and c, with NATS on 4222-4224, MQTT on 1883-1885 and HTTP on 8080-8082. Installs
# Debian's etcd-server and moto when they are missing, builds canopy in release mode,
# and prints `canopy cluster status` once the nodes have shared the shards.
#
#   ./scripts/three-nodes.sh
#
# Data live in memory (moto) and under target/three-nodes/; both go at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y "$@" >&2 || { apt-get update >&2 && apt-get install -y "$@" >&2; }
  else
    sudo apt-get install -y "$@" >&2 || { sudo apt-get update >&2 && sudo apt-get install -y "$@" >&2; }
  fi
}

command -v etcd >/dev/null || DEBIAN_FRONTEND=noninteractive apt_install etcd-server
venv=target/py-venv
if ! "$venv/bin/python" -c 'import moto' 2>/dev/null; then
  mkdir -p target
  python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$venv"; }
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'moto[server]==5.*'
fi
cargo build --release --quiet -p canopy
canopy=target/release/canopy

work=target/three-nodes
rm -rf "$work"
mkdir -p "$work"
services=()
nodes=()
# The nodes first (each hands its shards over, which needs etcd and S3), then the
# services.
stop() {
  kill "${nodes[@]}" 2>/dev/null || true
  wait "${nodes[@]}" 2>/dev/null || true
  kill "${services[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT TERM

# setsid: a Ctrl-C reaches this script only, which stops everything in order.
setsid "$venv/bin/moto_server" -H 127.0.0.1 -p 9000 >"$work/moto.log" 2>&1 &
services+=($!)
setsid etcd --name three-nodes --data-dir "$work/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster three-nodes=http://127.0.0.1:2380 >"$work/etcd.log" 2>&1 &
services+=($!)
for _ in $(seq 1 100); do
  if "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:9000/canopy', method='PUT'), timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.1
done

export CANOPY_STORE__URL=s3://canopy/cluster
export CANOPY_STORE__S3__ENDPOINT=http://127.0.0.1:9000
export CANOPY_STORE__S3__REGION=us-east-1
export CANOPY_STORE__S3__ACCESS_KEY_ID=demo
export CANOPY_STORE__S3__SECRET_ACCESS_KEY=demo
export CANOPY_STORE__S3__ALLOW_HTTP=true
export CANOPY_STORE__S3__PATH_STYLE=true
export CANOPY_CLUSTER__ETCD='["http://127.0.0.1:2379"]'
# Links between the nodes prove this secret; a fresh one each start.
CANOPY_CLUSTER__SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export CANOPY_CLUSTER__SECRET
n=0
for node in a b c; do
  CANOPY_CLUSTER__NODE_ID=$node CANOPY_CLUSTER__LISTEN="127.0.0.1:$((7422 + n))" \
    setsid "$canopy" serve --listen "127.0.0.1:$((4222 + n))" --mqtt-listen "127.0.0.1:$((1883 + n))" \
    --http-listen "127.0.0.1:$((8080 + n))" >"$work/$node.log" 2>&1 &
  nodes+=($!)
  n=$((n + 1))
done
sleep 3
"$canopy" cluster status
echo
echo "Three nodes: nats://127.0.0.1:4222, :4223, :4224 (MQTT 1883-1885, HTTP 8080-8082)."
echo "Logs in $work/. Ctrl-C stops everything."
wait
