#!/usr/bin/env bash
# What envelope encryption at rest costs: the same durable publishes and replays against
# Canopy storing `bench.>` in clear and sealed (store.keys from an environment variable,
# then `canopy encryption seal 'bench.>'`), with async-nats (a client from another
# project, benches/asyncnats_durable.rs) and with `canopy bench`.
#
#   benches/sealed.sh                     # full sizes
#   ROUNDS=1 SCALE=10 benches/sealed.sh   # quick look
#
# Every run starts one server alone on a fresh data folder (default config: a local
# folder, its journal, LZ4), clear and sealed alternating which goes first per round.
# Payloads are fresh random bytes (RANDOM=1, --random-payload), so that the clear runs
# do not gain from compressing what sealing makes incompressible; PAYLOAD=repeated
# measures one repeated byte instead (what compression gains in the clear runs).
# Runs: async-nats 1 connection x 256 unacked over 1,000 subjects at 100 B and 4 KiB;
# `canopy bench --shape durable` (4 connections, 128 B); `canopy bench --shape replay`
# (loads REPLAY_MSGS over 10,000 subjects, then reads one subject's first 100 messages,
# median over 20 subjects). Loopback only; the load tool and the server share this
# machine's CPUs. Raw JSON to $OUT/runs.jsonl (default target/bench-sealed).
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/servers.sh

ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-1}
SMALL_MSGS=$((${SMALL_MSGS:-200000} / SCALE))
LARGE_MSGS=$((${LARGE_MSGS:-50000} / SCALE))
DURABLE_MSGS=$((${DURABLE_MSGS:-500000} / SCALE))
REPLAY_MSGS=$((${REPLAY_MSGS:-500000} / SCALE))
out=${OUT:-target/bench-sealed}
if [[ ${PAYLOAD:-random} == random ]]; then random=1 random_flag=--random-payload; else random=0 random_flag=; fi

cargo build --release --quiet -p canopy -p canopy-bench
# The bench binary itself, so that no later build runs between the servers' runs.
asyncnats=$(cargo bench --bench asyncnats_durable --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "asyncnats_durable" and m.get("executable"):
        print(m["executable"])')
[[ -x $asyncnats ]] || { echo "sealed.sh: the asyncnats_durable bench did not build" >&2; exit 1; }
canopy=${CARGO_TARGET_DIR:-target}/release/canopy
mkdir -p "$out"
: >"$out/runs.jsonl"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/canopy-sealed-bench.XXXXXX")
cleanup() {
  stop_servers
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# A key-encryption key for this run only.
export CANOPY_BENCH_KEK="bench:$(python3 -c 'import secrets; print(secrets.token_hex(32))')"

start_canopy() { # mode (clear|sealed)
  local mode=$1
  rm -rf "$tmp/$mode" && mkdir -p "$tmp/$mode"
  port=$(free_port)
  env CANOPY_STORE__URL="file://$tmp/$mode" CANOPY_STORE__KEYS=env:CANOPY_BENCH_KEK \
    "$canopy" serve --listen "127.0.0.1:$port" --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >"$out/$mode.log" 2>&1 &
  pid=$!
  started "$pid"
  wait_port "$port" "$pid" "$mode"
  if [[ $mode == sealed ]]; then
    "$canopy" encryption seal 'bench.>' --server "127.0.0.1:$port" >/dev/null
  fi
}

record() { # mode run json
  printf '{"mode":"%s","run":"%s","result":%s}\n' "$1" "$2" "$3" >>"$out/runs.jsonl"
  echo "  $1 $2: $3" >&2
}

one_round() { # mode
  local mode=$1 json
  for run in "asyncnats 100B:100:$SMALL_MSGS" "asyncnats 4KiB:4096:$LARGE_MSGS"; do
    IFS=: read -r name size msgs <<<"$run"
    start_canopy "$mode"
    json=$(SERVER="nats://127.0.0.1:$port" MSGS=$msgs SIZE=$size RANDOM=$random "$asyncnats")
    record "$mode" "$name" "$json"
    stop_servers
  done
  start_canopy "$mode"
  json=$("$canopy" bench --server "nats://127.0.0.1:$port" --shape durable --msgs "$DURABLE_MSGS" --size 128 $random_flag --json)
  record "$mode" "canopy bench durable" "$json"
  stop_servers
  start_canopy "$mode"
  json=$("$canopy" bench --server "nats://127.0.0.1:$port" --shape replay --msgs "$REPLAY_MSGS" --size 128 --prefix bench.d.r $random_flag --json)
  record "$mode" "canopy bench replay" "$json"
  stop_servers
}

echo "sealed.sh: $(nproc) CPUs shared by the load tools and the server; $ROUNDS rounds; $("$canopy" --version)" >&2
for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2)); then order="clear sealed"; else order="sealed clear"; fi
  for mode in $order; do one_round "$mode"; done
done

python3 - "$out/runs.jsonl" <<'PY' >&2
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def figure(r):
    res = r["result"]
    if "acks_per_sec" in res:
        return res["acks_per_sec"], "acks/s"
    if "replay" in res:
        return res["replay"]["median_ns"] / 1e6, "ms replay median"
    return res["msgs_per_sec"], "msgs/s"
names = sorted({r["run"] for r in runs})
print("median over rounds (sealed / clear):")
for name in names:
    by = {}
    for r in runs:
        if r["run"] == name:
            value, unit = figure(r)
            by.setdefault(r["mode"], []).append(value)
    clear, sealed = statistics.median(by["clear"]), statistics.median(by["sealed"])
    print(f"  {name:22s} clear {clear:10.2f}  sealed {sealed:10.2f} {unit}  ratio {sealed / clear:.3f}")
PY
