// What the nats.js test scripts share: failing with a message (exit status 1, which
// the Rust test shows), and checking a condition.

export const fail = (what) => {
  console.error(what);
  process.exit(1);
};

export const check = (holds, what) => {
  if (!holds) {
    fail(what);
  }
};
