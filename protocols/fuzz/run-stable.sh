#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust (no cargo-fuzz, no nightly): builds the targets with
# LLVM's SanitizerCoverage passes, which are stable codegen options, and runs libFuzzer.
# No AddressSanitizer (that needs nightly); safe Rust does not need it for memory safety.
# Usage: protocols/fuzz/run-stable.sh native_client|native_server|mqtt_client|mqtt_server|ws_client [seconds]
# New inputs go to a scratch corpus outside the repo; the committed corpus is only read.
set -euo pipefail
target=${1:?native_client, native_server, mqtt_client, mqtt_server or ws_client}
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS away from build scripts.
(cd "$here" && cargo build --release --bin "$target" --target "$triple")
scratch=${FUZZ_SCRATCH:-$(mktemp -d)}
mkdir -p "$scratch/corpus" "$scratch/artifacts"
"$CARGO_TARGET_DIR/$triple/release/$target" "$scratch/corpus" "$here/corpus/$target" \
  -max_total_time="$secs" -max_len=2048 -artifact_prefix="$scratch/artifacts/"
echo "scratch corpus and any crash artifacts: $scratch"
