;; A deliver plugin in WebAssembly text: the reader `admin` gets every message as it
;; is; any other reader gets "redacted" instead, and nothing at all of a payload that
;; starts with `h` (hidden). What is stored does not change.
(module
  (import "canopy" "emit" (func $emit (param i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "admin")
  (data (i32.const 32) "redacted")
  (func (export "canopy_alloc") (param $len i32) (result i32)
    (local $pages i32)
    (local.set $pages (i32.shr_u (i32.add (local.get $len) (i32.const 66559)) (i32.const 16)))
    (if (i32.gt_u (local.get $pages) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $pages) (memory.size))))))
    (i32.const 1024))
  (func (export "on_deliver")
        (param $ptr i32) (param $sl i32) (param $hl i32) (param $pl i32) (param $rl i32)
        (result i32)
    (local $payload i32) (local $reader i32)
    (local.set $payload (i32.add (local.get $ptr) (i32.add (local.get $sl) (local.get $hl))))
    (local.set $reader (i32.add (local.get $payload) (local.get $pl)))
    (if (i32.and
          (i32.eq (local.get $rl) (i32.const 5))
          (i32.and
            (i32.eq (i32.load (local.get $reader)) (i32.load (i32.const 16)))
            (i32.eq (i32.load8_u offset=4 (local.get $reader)) (i32.load8_u (i32.const 20)))))
      (then (return (i32.const 0))))
    (if (i32.and (i32.gt_u (local.get $pl) (i32.const 0))
                 (i32.eq (i32.load8_u (local.get $payload)) (i32.const 104)))
      (then (return (i32.const 1))))
    (drop (call $emit (local.get $ptr) (local.get $sl)
                      (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                      (i32.const 32) (i32.const 8)))
    (i32.const 3)))
