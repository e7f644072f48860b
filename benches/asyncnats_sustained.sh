#!/usr/bin/env bash
# A sustained durable load from async-nats (benches/asyncnats_durable.rs: 4 connections
# x 256 in flight, 1,000 subjects, 100-byte payloads), Canopy (default config) and
# nats-server -js, each alone with a fresh folder, one after the other: acks/s, the
# server's CPU (user + system) per message over the load, its peak RSS (sampled every
# second) and its folder's bytes per message afterwards.
#
#   cargo build --release -p canopy && cargo bench --bench asyncnats_durable --no-run
#   NATS_SERVER=/path/to/nats-server MSGS=10000000 benches/asyncnats_sustained.sh
#
# Loopback only; the client and the server share this machine's cores.
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=${ASYNCNATS_DURABLE:-$(ls -t target/release/deps/asyncnats_durable-* 2>/dev/null | grep -v '\.d$' | head -1)}
NATS_SERVER=${NATS_SERVER:-nats-server}
[[ -x $BENCH ]] || { echo "asyncnats_sustained.sh: build it: cargo bench --bench asyncnats_durable --no-run" >&2; exit 1; }
MSGS=${MSGS:-10000000}
for server in canopy nats-js; do
  data=$(mktemp -d /tmp/sust-XXXX); port=$((16000 + RANDOM % 1000))
  case $server in
    canopy) CANOPY_STORE__URL="file://$data" target/release/canopy serve --listen 127.0.0.1:$port --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log warn >/dev/null 2>&1 & pid=$! ;;
    nats-js) "$NATS_SERVER" -js -sd "$data" -a 127.0.0.1 -p $port >/dev/null 2>&1 & pid=$! ;;
  esac
  sleep 1.5
  hz=$(getconf CLK_TCK)
  cpu() { awk -v hz=$hz '{print ($14+$15)/hz}' /proc/$pid/stat; }
  c0=$(cpu)
  (peak=0; while kill -0 $pid 2>/dev/null; do r=$(awk '/^VmRSS/{print $2}' /proc/$pid/status 2>/dev/null); [[ -n $r && $r -gt $peak ]] && peak=$r && echo $peak > $data.peak; sleep 1; done) &
  sampler=$!
  r=$(SERVER=nats://127.0.0.1:$port MSGS=$MSGS CONNS=4 IN_FLIGHT=256 SUBJECTS=1000 SIZE=100 $BENCH 2>/dev/null)
  c1=$(cpu)
  kill $pid; wait $pid 2>/dev/null; kill $sampler 2>/dev/null
  disk=$(du -sb $data | cut -f1)
  python3 -c 'import json,sys
r=json.loads(sys.argv[1]); c0,c1,msgs,disk,peak=float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4]),float(sys.argv[5]),float(sys.argv[6])
print(sys.argv[7], "acks/s %.0f" % r.get("acks_per_sec", r.get("msgs_per_sec", 0)), "cpu/msg %.2f us" % ((c1-c0)/msgs*1e6), "peak RSS %.0f MiB" % (peak/1024), "disk/msg %.0f B" % (disk/msgs))' "$r" $c0 $c1 $MSGS $disk "$(cat $data.peak 2>/dev/null || echo 0)" $server
  rm -rf $data $data.peak
done
