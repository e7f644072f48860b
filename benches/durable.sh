#!/usr/bin/env bash
# Durable key streams against JetStream: the same client (`canopy bench`) against Canopy
# (storing to file://, fsync on) and nats-server with JetStream on file storage.
#
#   benches/durable.sh                    # full sizes (several minutes)
#   ROUNDS=1 SCALE=10 benches/durable.sh  # quick look: a tenth of the messages, one round
#
# Phases, each on fresh servers with fresh data folders:
#   1. durable acked publishes, plain and with an expected version on every publish
#      (4 connections, 10,000 subjects, 256 unacked per connection), servers alternating;
#   2. replay: load 1,000,000 messages over 10,000 subjects `bench.d.r.<i>`, then time
#      reading one subject's first 100 messages, median over 20 subjects;
#   3. RSS after storing 1,000,000 distinct subjects (one message each);
#   4. the live shapes of benches/live.sh against Canopy with storing on (the default
#      policies) and off (CANOPY_STORE__POLICIES=[]): what storing costs;
#   5. only when asked (PHASES=sustained): 10,000,000 acked publishes from 10 publishers
#      over 1,000 subjects on each server, with the longest wait between two acks, ack
#      p99.9 and VmRSS every second (`$OUT/sustained-*-rss.txt`).
#
# Needs nats-server on PATH or in /usr/sbin (Debian: apt-get install nats-server). Loopback
# only. The load tool and the servers share this machine's CPUs: say so with the numbers.
# Raw JSON of every run goes to $OUT/runs.jsonl (default target/bench-durable).
# Env: CANOPY_STORE__FLUSH_INTERVAL_MS, CANOPY_STORE__MAX_BATCH etc. pass through to Canopy.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-1}
PHASES=${PHASES:-"durable replay rss live"}
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
DURABLE_MSGS=$((${DURABLE_MSGS:-500000} / SCALE))
REPLAY_MSGS=$((${REPLAY_MSGS:-1000000} / SCALE))
RSS_SUBJECTS=$((${RSS_SUBJECTS:-1000000} / SCALE))
SUSTAINED_MSGS=$((${SUSTAINED_MSGS:-10000000} / SCALE))
out=${OUT:-target/bench-durable}

[[ -x $NATS_SERVER ]] || { echo "durable.sh: nats-server not found" >&2; exit 1; }
# `canopy bench` runs canopy-bench, built beside canopy.
cargo build --release --quiet -p canopy -p canopy-bench
canopy=${CARGO_TARGET_DIR:-target}/release/canopy
mkdir -p "$out"
# APPEND=1 keeps the runs of an earlier invocation (e.g. PHASES="rss live" after the rest).
if [[ ${APPEND:-0} != 1 ]]; then
  : >"$out/runs.jsonl"
  : >"$out/rss.jsonl"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/canopy-durable-bench.XXXXXX")

cleanup() {
  stop_servers
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# Starts Canopy storing to a fresh folder; sets canopy_port and canopy_pid. Extra
# arguments are env assignments (e.g. CANOPY_STORE__POLICIES=[]).
start_canopy() { # name [VAR=value...]
  local name=$1
  shift
  rm -rf "$tmp/$name" && mkdir -p "$tmp/$name"
  canopy_port=$(free_port)
  env CANOPY_STORE__URL="file://$tmp/$name" "$@" \
    "$canopy" serve --listen "127.0.0.1:$canopy_port" --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >"$out/$name.log" 2>&1 &
  canopy_pid=$!
  started "$canopy_pid"
  wait_port "$canopy_port" "$canopy_pid" "$name"
}

# Starts nats-server with JetStream on a fresh folder; sets nats_port and nats_pid.
start_nats() { # name
  local name=$1
  rm -rf "$tmp/$name" && mkdir -p "$tmp/$name"
  nats_port=$(free_port)
  "$NATS_SERVER" -js -sd "$tmp/$name" -a 127.0.0.1 -p "$nats_port" >"$out/$name.log" 2>&1 &
  nats_pid=$!
  started "$nats_pid"
  wait_port "$nats_port" "$nats_pid" "$name"
}

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# CPU seconds (user + system) the process has used so far.
cpu_secs() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }

bench() { # label port run-name shape msgs extra...
  local label=$1 port=$2 name=$3 shape=$4 msgs=$5
  shift 5
  local json
  json=$("$canopy" bench --server "nats://127.0.0.1:$port" --shape "$shape" --msgs "$msgs" \
    --size 128 --json "$@") || return 1
  printf '{"server_label":"%s","run":"%s","result":%s}\n' "$label" "$name" "$json" >>"$out/runs.jsonl"
  python3 -c 'import json, sys
r = json.loads(sys.argv[1]); lat = r["latency"]
line = "  %-18s %-14s %10.0f msgs/s  p50 %.2f ms  p99 %.2f ms" % (sys.argv[2], sys.argv[3],
      r["msgs_per_sec"], lat["p50_ns"] / 1e6, lat["p99_ns"] / 1e6)
if "replay" in r:
    line += "  replay median %.2f ms" % (r["replay"]["median_ns"] / 1e6)
print(line, file=sys.stderr)' "$json" "$name" "$label"
}

echo "durable.sh: $(nproc) CPUs shared by the load tool and the servers; $ROUNDS rounds;" \
  "$("$NATS_SERVER" --version); $("$canopy" --version)" >&2

if [[ $PHASES == *durable* ]]; then
  echo "phase: durable acked publishes ($DURABLE_MSGS msgs per run)" >&2
  start_canopy canopy-durable
  start_nats nats-durable
  for round in $(seq 1 "$ROUNDS"); do
    for expect in "" "--expect"; do
      name="durable${expect:+ --expect}"
      # shellcheck disable=SC2086 # expect is a flag or nothing
      if ((round % 2)); then
        bench canopy "$canopy_port" "$name" durable "$DURABLE_MSGS" $expect
        bench nats-server "$nats_port" "$name" durable "$DURABLE_MSGS" $expect
      else
        bench nats-server "$nats_port" "$name" durable "$DURABLE_MSGS" $expect
        bench canopy "$canopy_port" "$name" durable "$DURABLE_MSGS" $expect
      fi
    done
  done
  stop_servers
fi

if [[ $PHASES == *replay* ]]; then
  echo "phase: replay ($REPLAY_MSGS msgs loaded over 10,000 subjects)" >&2
  start_canopy canopy-replay
  start_nats nats-replay
  bench canopy "$canopy_port" replay replay "$REPLAY_MSGS" --prefix bench.d.r
  bench nats-server "$nats_port" replay replay "$REPLAY_MSGS" --prefix bench.d.r
  # Again, nothing loaded: the same reads once the servers are idle.
  for round in $(seq 1 "$ROUNDS"); do
    bench canopy "$canopy_port" "replay (idle)" replay 0 --prefix bench.d.r
    bench nats-server "$nats_port" "replay (idle)" replay 0 --prefix bench.d.r
  done
  stop_servers
fi

if [[ $PHASES == *rss* ]]; then
  echo "phase: RSS with $RSS_SUBJECTS distinct stored subjects" >&2
  start_canopy canopy-rss
  start_nats nats-rss
  for label in canopy nats-server; do
    if [[ $label == canopy ]]; then pid=$canopy_pid port=$canopy_port; else pid=$nats_pid port=$nats_port; fi
    before=$(rss_kib "$pid")
    loaded=true
    bench "$label" "$port" "load distinct" durable "$RSS_SUBJECTS" \
      --subjects "$RSS_SUBJECTS" --prefix bench.d.k --timeout 30 || loaded=false
    sleep 2
    printf '{"server_label":"%s","subjects":%d,"loaded":%s,"rss_before_kib":%d,"rss_kib":%d,"hwm_kib":%d}\n' \
      "$label" "$RSS_SUBJECTS" "$loaded" "$before" "$(rss_kib "$pid")" "$(hwm_kib "$pid")" >>"$out/rss.jsonl"
  done
  stop_servers
fi

if [[ $PHASES == *sustained* ]]; then
  # 10 publishers x 256 unacked over 1,000 subjects, every publish acked: does the
  # server keep up without stalls (the longest wait between two acks of one
  # publisher), and does its memory stay flat (VmRSS sampled every second)?
  echo "phase: sustained ($SUSTAINED_MSGS acked msgs from 10 publishers)" >&2
  for label in ${SUSTAINED_SERVERS:-canopy nats-server}; do
    if [[ $label == canopy ]]; then
      start_canopy canopy-sustained
      pid=$canopy_pid port=$canopy_port folder=$tmp/canopy-sustained
    else
      start_nats nats-sustained
      pid=$nats_pid port=$nats_port folder=$tmp/nats-sustained
    fi
    cpu_before=$(cpu_secs "$pid")
    samples="$out/sustained-$label-rss.txt"
    (while kill -0 "$pid" 2>/dev/null; do
      echo "$(date +%s.%N) $(rss_kib "$pid")"
      sleep 1
    done) >"$samples" &
    sampler=$!
    bench "$label" "$port" sustained durable "$SUSTAINED_MSGS" --publishers 10 --subjects 1000 \
      || echo "  $label: sustained run FAILED" >&2
    cpu_load=$(cpu_secs "$pid")
    sleep 10 # memory after the load, once flushes and compaction settled
    cpu_after=$(cpu_secs "$pid")
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    stop_servers
    # CPU per message during the load and with the 10 s after it (compaction behind),
    # and the folder's bytes per message once the server stopped.
    python3 -c 'import sys
before, load, after, msgs, disk, label = sys.argv[1:]
msgs = float(msgs)
print(f"  {label}: server CPU per message {(float(load) - float(before)) / msgs * 1e6:.2f} us "
      f"({(float(after) - float(before)) / msgs * 1e6:.2f} us with the 10 s after); "
      f"{float(disk) / msgs:.0f} bytes on disk per message", file=sys.stderr)' \
      "$cpu_before" "$cpu_load" "$cpu_after" "$SUSTAINED_MSGS" "$(du -sb "$folder" | cut -f1)" "$label"
    python3 - "$out/runs.jsonl" "$samples" "$label" <<'PY' >&2
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
mine = [r["result"] for r in runs if r["run"] == "sustained" and r["server_label"] == sys.argv[3]]
rss = [(float(t), int(k)) for t, k in (l.split() for l in open(sys.argv[2]) if len(l.split()) == 2)]
if not mine or not rss:
    sys.exit(0)
r = mine[-1]
lat, t0 = r["latency"], rss[0][0]
warm = [k for t, k in rss if t - t0 >= 10]
print(f'  {sys.argv[3]}: {r["msgs_per_sec"]:,.0f} acks/s; ack p50 {lat["p50_ns"] / 1e6:.2f} ms, '
      f'p99 {lat["p99_ns"] / 1e6:.2f} ms, p99.9 {lat["p999_ns"] / 1e6:.2f} ms, max '
      f'{lat["max_ns"] / 1e6:.1f} ms; longest gap between acks '
      f'{r["durable"]["max_ack_gap_ns"] / 1e6:.1f} ms; RSS MiB after 10 s min '
      f'{min(warm or [0]) / 1024:.0f} max {max(warm or [0]) / 1024:.0f}, at the end '
      f'{rss[-1][1] / 1024:.0f}')
PY
  done
fi

if [[ $PHASES == *live* ]]; then
  echo "phase: live shapes, Canopy storing on vs off" >&2
  start_canopy canopy-store-on
  on_port=$canopy_port
  start_canopy canopy-store-off CANOPY_STORE__POLICIES=[]
  off_port=$canopy_port
  LIVE=(
    "pubsub|pubsub|$((1000000 / SCALE))|"
    "fanin|fanin|$((1000000 / SCALE))|"
    "fanout|fanout|$((300000 / SCALE))|"
    "reqrep w=1|reqrep|$((50000 / SCALE))|--window 1"
    "reqrep w=64|reqrep|$((500000 / SCALE))|--window 64"
  )
  for round in $(seq 1 "$ROUNDS"); do
    for run in "${LIVE[@]}"; do
      IFS='|' read -r name shape msgs extra <<<"$run"
      # shellcheck disable=SC2086 # extra is a list of flags
      if ((round % 2)); then
        bench "store on" "$on_port" "$name" "$shape" "$msgs" $extra
        bench "store off" "$off_port" "$name" "$shape" "$msgs" $extra
      else
        bench "store off" "$off_port" "$name" "$shape" "$msgs" $extra
        bench "store on" "$on_port" "$name" "$shape" "$msgs" $extra
      fi
    done
  done
  stop_servers
fi

python3 - "$out/runs.jsonl" "$out/rss.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
rss = [json.loads(line) for line in open(sys.argv[2])]
order, table = [], {}
for r in runs:
    if r["run"] not in order:
        order.append(r["run"])
    table.setdefault((r["run"], r["server_label"]), []).append(r["result"])

def med(results, key):
    return statistics.median(key(r) for r in results)

def ms(ns):
    return f"{ns / 1e6:.2f}"

def lat(rs):
    return " / ".join(ms(med(rs, lambda r, q=q: r["latency"][q])) for q in ("p50_ns", "p99_ns", "p999_ns"))

durable = [n for n in order if n.startswith("durable")]
if durable:
    print("\n### Durable acked publish (128 B, 4 connections, 10,000 subjects, 256 unacked per connection)\n")
    print("| run | canopy acks/s | JetStream acks/s | canopy / JetStream | canopy p50 / p99 / p99.9 ms | JetStream p50 / p99 / p99.9 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in durable:
        c, n = table.get((name, "canopy")), table.get((name, "nats-server"))
        if not c or not n:
            continue
        cr, nr = med(c, lambda r: r["msgs_per_sec"]), med(n, lambda r: r["msgs_per_sec"])
        print(f"| {name} | {cr:,.0f} | {nr:,.0f} | {cr / nr:.2f} | {lat(c)} | {lat(n)} |")

replays = [n for n in order if n.startswith("replay")]
if replays:
    print("\n### Replay: first 100 messages of one subject (median of 20 subjects per run, median of runs)\n")
    print("| run | canopy median / p90 / max ms | JetStream median / p90 / max ms | load acks/s canopy / JetStream |")
    print("|---|---:|---:|---:|")
    for name in replays:
        c, n = table.get((name, "canopy")), table.get((name, "nats-server"))
        if not c or not n:
            continue
        rp = lambda rs: " / ".join(ms(med(rs, lambda r, k=k: r["replay"][k])) for k in ("median_ns", "p90_ns", "max_ns"))
        load = lambda rs: f'{med(rs, lambda r: r["msgs_per_sec"]):,.0f}' if rs[0]["delivered"] else "-"
        print(f"| {name} | {rp(c)} | {rp(n)} | {load(c)} / {load(n)} |")
    methods = {r["server_label"]: r["result"]["replay"]["method"] for r in runs if r["run"].startswith("replay")}
    for label, method in methods.items():
        print(f"\n{label}: {method}")

if rss:
    print("\n### RSS with distinct stored subjects (one message each)\n")
    print("| server | subjects | RSS before MiB | RSS after MiB | peak (VmHWM) MiB | load acks/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rss:
        loads = table.get(("load distinct", r["server_label"]), [])
        rate = f'{loads[-1]["msgs_per_sec"]:,.0f}' if loads else "-"
        subjects = f'{r["subjects"]:,}' + ("" if r.get("loaded", True) else " (load FAILED)")
        print(f'| {r["server_label"]} | {subjects} | {r["rss_before_kib"] / 1024:.0f} | '
              f'{r["rss_kib"] / 1024:.0f} | {r["hwm_kib"] / 1024:.0f} | {rate} |')

live = [n for n in order if ((n, "store on") in table)]
if live:
    print("\n### Live shapes on Canopy: storing on (default policies) vs off\n")
    print("| shape | store on msgs/s | store off msgs/s | on / off | on p50 / p99 ms | off p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in live:
        on, off = table[(name, "store on")], table.get((name, "store off"))
        if not off:
            continue
        a, b = med(on, lambda r: r["msgs_per_sec"]), med(off, lambda r: r["msgs_per_sec"])
        l2 = lambda rs: " / ".join(ms(med(rs, lambda r, q=q: r["latency"][q])) for q in ("p50_ns", "p99_ns"))
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {a / b:.2f} | {l2(on)} | {l2(off)} |")
PY
