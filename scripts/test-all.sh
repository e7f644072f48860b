#!/usr/bin/env bash
# Runs every test of Canopy. On a fresh machine it first installs what the tests
# need (a Python venv under target/ with nats-py, paho-mqtt, pyiceberg and moto's S3 server;
# Debian's mosquitto-clients for mosquitto_pub and mosquitto_sub; Debian's etcd-server for
# the cluster tests; Node with MQTT.js,
# playwright-core and the AsyncAPI specs from tests/js/package-lock.json; Debian's
# chromium), starts an
# S3-compatible server (moto) and an etcd on free loopback ports, runs the
# whole suite, runs the durable-stream tests again on the file and S3 backends, and
# stops moto and etcd. A missing tool is an error here, never a skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."

# apt-get as root (CI runs this script as root), through sudo otherwise.
apt_install() {
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y "$@" >&2 || { apt-get update >&2 && apt-get install -y "$@" >&2; }
  elif command -v sudo >/dev/null; then
    sudo apt-get install -y "$@" >&2 || { sudo apt-get update >&2 && sudo apt-get install -y "$@" >&2; }
  else
    echo "test-all: cannot install $* (not root and no sudo): install it and run again" >&2
    exit 1
  fi
}

venv=target/py-venv
if ! "$venv/bin/python" -c 'import nats, moto, paho.mqtt, pyiceberg.catalog.sql, pyarrow' 2>/dev/null; then
  echo "test-all: installing nats-py, paho-mqtt, moto and pyiceberg into $venv" >&2
  mkdir -p target
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian splits venv support out of python3.
    apt_install python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'nats-py==2.16.0' 'moto[server]==5.*' 'paho-mqtt==2.*' 'pyiceberg[sql-sqlite,pyarrow]==0.12.0'
fi
"$venv/bin/python" -c 'import nats, moto, paho.mqtt, pyiceberg.catalog.sql, pyarrow' || {
  echo "test-all: $venv lacks nats-py, moto, paho-mqtt or pyiceberg after installing them" >&2
  exit 1
}

# Node, MQTT.js, nats.js, playwright-core and the AsyncAPI specs (tests/js, pinned by its
# package-lock.json), for the browser-side tests and the AsyncAPI document's check.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "test-all: installing nodejs and npm" >&2
  apt_install nodejs npm
fi
if [ ! -d tests/js/node_modules/mqtt ] || [ ! -d tests/js/node_modules/playwright-core ] ||
  [ ! -d tests/js/node_modules/@asyncapi/specs ] || [ ! -d tests/js/node_modules/nats ] ||
  [ ! -d tests/js/node_modules/assemblyscript ] ||
  [ tests/js/package-lock.json -nt tests/js/node_modules ]; then
  echo "test-all: installing the JavaScript test clients (npm ci in tests/js)" >&2
  npm ci --prefix tests/js --no-audit --no-fund >&2
fi

# Debian's Chromium, which tests/js/browser.mjs drives headless through playwright-core
# (never Playwright's own browser downloads), for the browser tests (tests/it/browser.rs).
if [ ! -x /usr/bin/chromium ]; then
  echo "test-all: installing chromium" >&2
  DEBIAN_FRONTEND=noninteractive apt_install chromium
fi
[ -x /usr/bin/chromium ] || {
  echo "test-all: /usr/bin/chromium is still missing" >&2
  exit 1
}

# Mosquitto's command-line clients, for the MQTT tests.
if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto_sub >/dev/null; then
  echo "test-all: installing mosquitto-clients" >&2
  apt_install mosquitto-clients
fi
command -v mosquitto_pub >/dev/null && command -v mosquitto_sub >/dev/null || {
  echo "test-all: mosquitto_pub and mosquitto_sub are still missing" >&2
  exit 1
}

# Debian's etcd, for the cluster tests.
if ! command -v etcd >/dev/null; then
  echo "test-all: installing etcd-server" >&2
  DEBIAN_FRONTEND=noninteractive apt_install etcd-server
fi
command -v etcd >/dev/null || {
  echo "test-all: etcd is still missing" >&2
  exit 1
}

free_port() {
  "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# moto's S3 server and one etcd member on free loopback ports, stopped however this
# script ends.
port=$(free_port)
"$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >target/moto.log 2>&1 &
moto_pid=$!
etcd_client=$(free_port)
etcd_peer=$(free_port)
rm -rf target/etcd-data
etcd --name canopy-tests --data-dir target/etcd-data \
  --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "canopy-tests=http://127.0.0.1:$etcd_peer" >target/etcd.log 2>&1 &
etcd_pid=$!
trap 'kill "$moto_pid" "$etcd_pid" 2>/dev/null || true; rm -rf target/etcd-data' EXIT
for _ in $(seq 1 100); do
  if "$venv/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $etcd_client), 0.2)" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
export CANOPY_TEST_ETCD="http://127.0.0.1:$etcd_client"
for _ in $(seq 1 100); do
  if "$venv/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
# An unsigned PUT creates the bucket.
"$venv/bin/python" - "$port" <<'PY'
import sys, urllib.request
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/canopy-tests", method="PUT")
urllib.request.urlopen(request, timeout=10).read()
PY
export CANOPY_TEST_S3_ENDPOINT="http://127.0.0.1:$port"

# A failing test's message and place come last in the output, where CI's tail shows
# them; a backtrace would push them out of it.
export RUST_BACKTRACE=0

cargo test --workspace --locked "$@"

# The durable-stream tests again, on a local folder and on S3.
rm -rf target/test-stores
for backend in file s3; do
  echo "test-all: durable tests on the $backend backend" >&2
  CANOPY_TEST_BACKEND=$backend cargo test --locked --test it "$@" -- durable:: snapshots::
done
rm -rf target/test-stores
