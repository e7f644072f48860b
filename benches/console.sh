#!/usr/bin/env bash
# The web console under load: headless Chromium (tests/js/console_load.mjs, on the
# test harness tests/js/browser.mjs) subscribes to devices.*.temp in the console while
# an MQTT client publishes RATE msgs/s (default 2,000) for LOAD_SECS (default 10) to a
# release build of Canopy storing on a fresh folder. Prints one JSON line per round:
# publish rate reached, seconds until the panel had counted every message, frames per
# second, the longest gap between frames, main-thread long tasks, rows kept.
#
#   benches/console.sh                    # 3 rounds at 2,000 msgs/s
#   RATE=5000 ROUNDS=1 benches/console.sh
#
# Needs what ./scripts/test-all.sh installs (chromium, node, tests/js/node_modules).
# Loopback only; only the server this script started is stopped, by PID. The browser,
# the publisher and the server share this machine's two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

ROUNDS=${ROUNDS:-3}
RATE=${RATE:-2000}
LOAD_SECS=${LOAD_SECS:-10}
cargo build --release --quiet
canopy=${CARGO_TARGET_DIR:-target}/release/canopy
out=target/bench-console
mkdir -p "$out"
trap stop_servers EXIT
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$out/store"
  native=$(free_port) mqtt=$(free_port) http=$(free_port)
  CANOPY_STORE__URL="file://$PWD/$out/store" "$canopy" serve --listen "127.0.0.1:$native" \
    --mqtt-listen "127.0.0.1:$mqtt" --http-listen "127.0.0.1:$http" --log warn \
    >"$out/canopy.log" 2>&1 &
  pid=$!
  started "$pid"
  wait_port "$http" "$pid" canopy
  wait_port "$mqtt" "$pid" canopy
  echo "round $round: $(cd tests/js && CANOPY_SCREENSHOT_DIR="$PWD/../../$out" \
    node console_load.mjs "http://127.0.0.1:$http" "mqtt://127.0.0.1:$mqtt" "$RATE" "$LOAD_SECS")"
  stop_servers
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
