#!/usr/bin/env bash
# Two Canopy builds side by side (issue 13: the client-core refactor must not cost speed):
# the same load tool (`canopy-bench`, what `canopy bench` runs) drives the live native
# shapes and the MQTT shapes against a BEFORE and an AFTER `canopy` binary, with the
# anchors in the same run: nats-server for the native shapes, Mosquitto for the MQTT
# shapes. ROUNDS rounds, servers taking turns in an order that changes every round,
# medians, the spread of the rounds, and after / before per round.
#
#   benches/compare.sh BEFORE=/path/to/old/canopy AFTER=/path/to/new/canopy
#   ROUNDS=3 SCALE=10 benches/compare.sh BEFORE=... AFTER=...   # quick look
#   SHAPES="fanin mqtt-qos1" benches/compare.sh BEFORE=... AFTER=...
#   NATSPY=/path/to/venv/bin/python benches/compare.sh BEFORE=... AFTER=...
#
# BEFORE and AFTER may also come from the environment. The load tool is BENCH (default:
# the canopy-bench beside AFTER); NATS_SERVER (default: nats-server on PATH) and
# MOSQUITTO (default /usr/sbin/mosquitto) are the anchors. Nothing is built here: build
# both binaries first (e.g. `cargo build --release -p canopy -p canopy-bench` at each
# commit, copying the binaries out).
#
# With NATSPY (a Python that has nats-py), the shape natspy-pubsub is added: 1 publisher
# -> 1 subscriber through nats-py, a client from another project
# (benches/natspy_pubsub.py), against the same servers as the native shapes.
#
# Every run gets a server of its own, started afresh on free loopback ports and stopped
# (by PID) right after, so no run inherits another's queues or store state:
#   - Canopy with its default config (every subject stored, fsynced) on a fresh folder
#     under $OUT; extra CANOPY_* environment variables pass through to both builds;
#   - nats-server with its defaults (`-a 127.0.0.1 -p PORT`, no JetStream);
#   - Mosquitto configured as benches/mqtt.sh does: set_tcp_nodelay, no queue limits,
#     max_inflight_messages 64, persistence false.
# Server CPU per message is the server's utime + stime over the run, over the messages
# received (deliveries for fan-out).
#
# Loopback only. The load tool and the server share this machine's CPUs: say so with the
# numbers (the load average is printed). A failed run (stall, slow-consumer cut, refused
# publish) is recorded as failed, never as a result, and makes the script exit 1 at the
# end. Raw JSON lines of every run go to $OUT/runs.jsonl (default target/bench-compare).
set -euo pipefail
for arg in "$@"; do
  case $arg in
    BEFORE=* | AFTER=* | BENCH=* | ROUNDS=* | SCALE=* | SHAPES=* | NATSPY=*) export "${arg?}" ;;
    *) echo "compare.sh: unknown argument $arg (expected BEFORE=... AFTER=...)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
source benches/servers.sh

: "${BEFORE:?compare.sh: give BEFORE=/path/to/canopy (the old build)}"
: "${AFTER:?compare.sh: give AFTER=/path/to/canopy (the new build)}"
BEFORE=$(realpath "$BEFORE") AFTER=$(realpath "$AFTER")
BENCH=$(realpath "${BENCH:-$(dirname "$AFTER")/canopy-bench}")
ROUNDS=${ROUNDS:-5}
SCALE=${SCALE:-1}
SHAPES=${SHAPES:-pubsub fanin fanout mqtt-fanin mqtt-qos1 mqtt-fanout${NATSPY:+ natspy-pubsub}}
NATS_SERVER=${NATS_SERVER:-nats-server}
MOSQUITTO=${MOSQUITTO:-/usr/sbin/mosquitto}
out=${OUT:-target/bench-compare}

# shape -> messages (the sizes of benches/live.sh and benches/mqtt.sh)
declare -A MSGS=(
  [pubsub]=$((1000000 / SCALE))
  [fanin]=$((1000000 / SCALE))
  [fanout]=$((300000 / SCALE))
  [mqtt-fanin]=$((1000000 / SCALE))
  [mqtt-qos1]=$((200000 / SCALE))
  [mqtt-fanout]=$((30000 / SCALE))
  [natspy-pubsub]=$((200000 / SCALE))
)

for bin in "$BEFORE" "$AFTER" "$BENCH"; do
  [[ -x $bin ]] || { echo "compare.sh: $bin is not an executable" >&2; exit 1; }
done
for shape in $SHAPES; do
  [[ -n ${MSGS[$shape]:-} ]] || { echo "compare.sh: unknown shape $shape" >&2; exit 1; }
  case $shape in
    natspy-*) [[ -n ${NATSPY:-} ]] && "$NATSPY" -c 'import nats' 2>/dev/null \
      || { echo "compare.sh: $shape needs NATSPY=/path/to/python with nats-py" >&2; exit 1; } ;;&
    mqtt-*) [[ -x $MOSQUITTO ]] || { echo "compare.sh: $MOSQUITTO not found (Debian: apt-get install mosquitto)" >&2; exit 1; } ;;
    *) command -v "$NATS_SERVER" >/dev/null || { echo "compare.sh: $NATS_SERVER not found" >&2; exit 1; } ;;
  esac
done

mkdir -p "$out"
rm -rf "$out"/store-*
: >"$out/runs.jsonl"
for name in before after nats-server mosquitto; do : >"$out/$name.log"; done
failures=0

# utime + stime of a process, in clock ticks.
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
TICK=$(getconf CLK_TCK)

trap stop_servers EXIT
trap 'exit 130' INT TERM

# Starts the server LABEL for SHAPE; sets server_pid and server_port (the port the load
# tool talks to) and store (a folder to delete afterwards, or empty).
start_server() { # label shape round
  local label=$1 shape=$2 round=$3 bin native mqtt
  store=
  case $label in
    before | after)
      [[ $label == before ]] && bin=$BEFORE || bin=$AFTER
      native=$(free_port) mqtt=$(free_port)
      store="$PWD/$out/store-$label-r$round-$shape"
      CANOPY_STORE__URL="file://$store" "$bin" serve --listen "127.0.0.1:$native" \
        --mqtt-listen "127.0.0.1:$mqtt" --http-listen 127.0.0.1:0 --log warn \
        >>"$out/$label.log" 2>&1 &
      server_pid=$!
      [[ $shape == mqtt-* ]] && server_port=$mqtt || server_port=$native
      ;;
    nats-server)
      server_port=$(free_port)
      "$NATS_SERVER" -a 127.0.0.1 -p "$server_port" >>"$out/nats-server.log" 2>&1 &
      server_pid=$!
      ;;
    mosquitto)
      server_port=$(free_port)
      cat >"$out/mosquitto.conf" <<EOF
# Generated by benches/compare.sh (as benches/mqtt.sh): loopback, nodelay, no queue
# limits, in memory.
listener $server_port 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 64
max_inflight_bytes 0
max_connections -1
persistence false
connection_messages false
log_dest stderr
log_type error
log_type warning
EOF
      "$MOSQUITTO" -c "$out/mosquitto.conf" >>"$out/mosquitto.log" 2>&1 &
      server_pid=$!
      ;;
  esac
  started "$server_pid"
  wait_port "$server_port" "$server_pid" "$label"
  # Both Canopy listeners must be up before the run (the MQTT one is not always last).
  if [[ $label == before || $label == after ]]; then
    wait_port "$native" "$server_pid" "$label"
    wait_port "$mqtt" "$server_pid" "$label"
  fi
}

record_failure() { # label shape round stderr-file
  failures=$((failures + 1))
  echo "  $2 against $1 FAILED: $(tr '\n' ' ' <"$4")" >&2
  python3 -c 'import json, sys
print(json.dumps({"server_label": sys.argv[1], "run": sys.argv[2], "round": int(sys.argv[3]),
                  "error": open(sys.argv[4]).read().strip()}))' "$1" "$2" "$3" "$4" \
    >>"$out/runs.jsonl"
}

run_one() { # label shape round
  local label=$1 shape=$2 round=$3 url cpu0 json line
  start_server "$label" "$shape" "$round"
  [[ $shape == mqtt-* ]] && url="mqtt://127.0.0.1:$server_port" || url="nats://127.0.0.1:$server_port"
  cpu0=$(cpu_ticks "$server_pid")
  local load=("$BENCH" --server "$url" --shape "$shape" --msgs "${MSGS[$shape]}" --size 128 --json)
  [[ $shape != natspy-* ]] || load=("$NATSPY" benches/natspy_pubsub.py --server "$url" --msgs "${MSGS[$shape]}")
  if json=$("${load[@]}" 2>"$out/bench.err"); then
    line=$(printf '{"server_label":"%s","run":"%s","round":%d,"server_cpu_secs":%s,"result":%s}' \
      "$label" "$shape" "$round" \
      "$(awk -v a="$cpu0" -v b="$(cpu_ticks "$server_pid")" -v t="$TICK" 'BEGIN { printf "%.3f", (b - a) / t }')" \
      "$json")
    echo "$line" >>"$out/runs.jsonl"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1]); res = r["result"]; lat = res["latency"]
print("  %-12s %-12s %12.0f /s  p50 %8.3f ms  p99 %8.3f ms  server cpu %.2f us/msg" % (
    r["run"], r["server_label"], res["msgs_per_sec"], lat["p50_ns"] / 1e6, lat["p99_ns"] / 1e6,
    r["server_cpu_secs"] * 1e6 / res["delivered"]), file=sys.stderr)' "$line"
  else
    record_failure "$label" "$shape" "$round" "$out/bench.err"
  fi
  stop_servers
  [[ -z $store ]] || rm -rf "$store"
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
describe() { "$@" 2>&1 | head -1 || true; }
{
  echo "compare.sh: $(nproc) CPUs shared by the load tool and the server under test;" \
    "load average $load_start; $ROUNDS rounds; shapes: $SHAPES"
  echo "  before: $BEFORE ($(sha256sum "$BEFORE" | cut -c1-12))"
  echo "  after:  $AFTER ($(sha256sum "$AFTER" | cut -c1-12))"
  echo "  load tool: $BENCH; anchors: $(describe "$NATS_SERVER" --version);" \
    "$(describe "$MOSQUITTO" -h)"
} >&2

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS ($(date -u +%H:%M:%S), load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  # before and after swap places every round; the anchor moves through the three places.
  if (( round % 2 )); then pair=(before after); else pair=(after before); fi
  for shape in $SHAPES; do
    [[ $shape == mqtt-* ]] && anchor=mosquitto || anchor=nats-server
    order=("${pair[@]}")
    order=("${order[@]:0:$(((round - 1) % 3))}" "$anchor" "${order[@]:$(((round - 1) % 3))}")
    for label in "${order[@]}"; do
      run_one "$label" "$shape" "$round"
    done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$out/runs.jsonl" "$load_start" "$load_end" "$(nproc)" "$ROUNDS" <<'PY'
import json, statistics, sys
path, load_start, load_end, cpus, rounds = sys.argv[1:]
runs = [json.loads(line) for line in open(path)]
ok, failed, order = {}, {}, []
for r in runs:
    if r["run"] not in order:
        order.append(r["run"])
    (failed if "error" in r else ok).setdefault((r["run"], r["server_label"]), []).append(r)

what = {
    "pubsub": "native 1 pub → 1 sub",
    "fanin": "native fan-in: 4 pub over 10,000 subjects → `bench.>`",
    "fanout": "native fan-out: 1 pub → 10 subs (`*`), deliveries",
    "mqtt-fanin": "MQTT QoS 0 fan-in: 8 pub over 10,000 topics → `bench/#`",
    "mqtt-qos1": "MQTT QoS 1: 4 pub × 64 unacked, PUBACKs",
    "mqtt-fanout": "MQTT QoS 0 fan-out: 1 pub → 100 subs (`bench/x/+`), deliveries",
    "natspy-pubsub": "nats-py 1 pub → 1 sub (a client from another project)",
}
rate = lambda r: r["result"]["msgs_per_sec"]
cpu = lambda r: r["server_cpu_secs"] * 1e6 / r["result"]["delivered"]

def rs(run, label):
    return ok.get((run, label), [])

def med(run, label, f):
    v = [f(r) for r in rs(run, label)]
    return statistics.median(v) if v else None

def k(v):
    return "-" if v is None else f"{v / 1e3:,.0f}k"

def spread(run, label):
    v = [rate(r) for r in rs(run, label)]
    if not v:
        return "-"
    m = statistics.median(v)
    return f"{(min(v) - m) / m * 100:+.0f}/{(max(v) - m) / m * 100:+.0f}%"

def ratio(a, b):
    return f"{a / b:.3f}" if a is not None and b else "-"

def ms(run, label, key):
    v = med(run, label, lambda r: r["result"]["latency"][key])
    return "-" if v is None else f"{v / 1e6:.1f}" if v >= 1e7 else f"{v / 1e6:.2f}"

print(f"{cpus} CPUs shared by the load tool and the server under test (one server at a "
      f"time); load average {load_start} at the start, {load_end} at the end; "
      f"medians of {rounds} rounds; msgs/s received (deliveries for fan-out).\n")
print("| shape | before | after | after / before (medians) | after / before per round: median, min-max "
      "| spread before, after | anchor | before / anchor | after / anchor "
      "| p50 / p99 ms before; after; anchor | server CPU µs/msg before / after / anchor |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for run in order:
    anchor = "mosquitto" if run.startswith("mqtt-") else "nats-server"
    b, a, x = (med(run, l, rate) for l in ("before", "after", anchor))
    per_round = {}
    for label in ("before", "after"):
        for r in rs(run, label):
            per_round.setdefault(r["round"], {})[label] = rate(r)
    pr = sorted(v["after"] / v["before"] for v in per_round.values() if len(v) == 2)
    prc = (f"{statistics.median(pr):.3f}, {pr[0]:.3f}-{pr[-1]:.3f}" if pr else "-")
    bad = sum(len(failed.get((run, l), [])) for l in ("before", "after", anchor))
    name = what.get(run, run) + (f" ({bad} failed runs)" if bad else "")
    lat = "; ".join(f"{ms(run, l, 'p50_ns')} / {ms(run, l, 'p99_ns')}" for l in ("before", "after", anchor))
    c = " / ".join("-" if med(run, l, cpu) is None else f"{med(run, l, cpu):.2f}"
                   for l in ("before", "after", anchor))
    print(f"| {name} | {k(b)} | {k(a)} | {ratio(a, b)} | {prc} | {spread(run, 'before')}, "
          f"{spread(run, 'after')} | {anchor} {k(x)} | {ratio(b, x)} | {ratio(a, x)} | {lat} | {c} |")

errors = [r for r in runs if "error" in r]
if errors:
    print(f"\n{len(errors)} failed runs:")
    for r in errors:
        print(f"- round {r['round']}, {r['run']} against {r['server_label']}: {r['error']}")
PY

if (( failures > 0 )); then
  echo "compare.sh: $failures runs failed (see the table and $out/runs.jsonl)" >&2
  exit 1
fi
