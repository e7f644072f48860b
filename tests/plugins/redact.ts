// A publish plugin in AssemblyScript, on Canopy's plugin ABI (README, "Plugins"): a
// JSON field transform that masks the value of a "secret" field, and rejects a
// payload whose "secret" is not a string. Built by the tests with
// `asc redact.ts --runtime incremental -O3 -o redact.wasm`.

@external("canopy", "emit")
declare function emit(sp: usize, sl: i32, hp: usize, hl: i32, pp: usize, pl: i32): i32;

@external("canopy", "reject")
declare function reject(ptr: usize, len: i32): void;

// One input buffer, grown as messages need.
let buffer: usize = 0;
let capacity: i32 = 0;

export function canopy_alloc(len: i32): usize {
  if (len > capacity) {
    buffer = buffer == 0 ? heap.alloc(<usize>len) : heap.realloc(buffer, <usize>len);
    capacity = len;
  }
  return buffer;
}

export function on_publish(ptr: usize, sl: i32, hl: i32, pl: i32): i32 {
  const payload = String.UTF8.decodeUnsafe(ptr + <usize>(sl + hl), <usize>pl);
  const key = '"secret":';
  const at = payload.indexOf(key);
  if (at < 0) return 0;
  const start = at + key.length;
  if (payload.charAt(start) != '"') {
    const why = String.UTF8.encode("the secret must be a string");
    reject(changetype<usize>(why), why.byteLength);
    return 2;
  }
  const end = payload.indexOf('"', start + 1);
  if (end < 0) return 0;
  const out = payload.substring(0, start + 1) + "***" + payload.substring(end);
  const bytes = String.UTF8.encode(out);
  emit(ptr, sl, ptr + <usize>sl, hl, changetype<usize>(bytes), bytes.byteLength);
  return 3;
}
