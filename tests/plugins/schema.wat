;; A publish plugin that reads the JSON Schema bound to its subject (the `schema` host
;; function) and publishes that schema in place of the message; with no schema bound,
;; the message passes.
(module
  (import "canopy" "emit" (func $emit (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "canopy" "schema" (func $schema (param i32 i32) (result i32)))
  (memory (export "memory") 2)
  ;; The input goes at 1024, the schema at 65536 (up to 64 KiB).
  (func (export "canopy_alloc") (param $len i32) (result i32) (i32.const 1024))
  (func (export "on_publish")
        (param $ptr i32) (param $sl i32) (param $hl i32) (param $pl i32) (result i32)
    (local $len i32)
    (local.set $len (call $schema (i32.const 65536) (i32.const 65536)))
    (if (i32.le_s (local.get $len) (i32.const 0)) (then (return (i32.const 0))))
    ;; The headers as they came: a JetStream publisher's stay, and so does its ack.
    (drop (call $emit (local.get $ptr) (local.get $sl)
                      (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                      (i32.const 65536) (local.get $len)))
    (i32.const 3)))
