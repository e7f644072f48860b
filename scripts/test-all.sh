#!/usr/bin/env bash
# Runs every test of Canopy. On a fresh machine it first installs what the tests
# need (a Python venv with nats-py under target/), so a clean clone needs nothing
# but Rust and Python 3. A missing tool is an error here, never a skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
if ! "$venv/bin/python" -c 'import nats' 2>/dev/null; then
  echo "test-all: installing nats-py into $venv" >&2
  mkdir -p target
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian splits venv support out of python3.
    apt-get install -y python3-venv >&2
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'nats-py==2.16.0'
fi

cargo test --workspace --locked "$@"
