;; A publish plugin in WebAssembly text, on Canopy's plugin ABI (README, "Plugins"):
;; a payload starting with `x` is dropped, one starting with `!` is rejected with a
;; reason, one starting with `*` is fanned out to `<subject>.copy` as well, one
;; starting with `$` is fanned out to `$CANOPY.purge` too (which must be refused), and
;; any other is passed on in capitals (a transform: the message is replaced).
(module
  (import "canopy" "emit" (func $emit (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "canopy" "reject" (func $reject (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "no bangs here")
  (data (i32.const 32) ".copy")
  (data (i32.const 48) "$CANOPY.purge")
  ;; The input goes at 1024; the memory grows to hold it.
  (func (export "canopy_alloc") (param $len i32) (result i32)
    (local $pages i32)
    (local.set $pages
      (i32.shr_u (i32.add (i32.add (local.get $len) (i32.const 8192)) (i32.const 65535))
                 (i32.const 16)))
    (if (i32.gt_u (local.get $pages) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $pages) (memory.size))))))
    (i32.const 1024))
  (func (export "on_publish")
        (param $ptr i32) (param $sl i32) (param $hl i32) (param $pl i32) (result i32)
    (local $payload i32) (local $i i32) (local $c i32) (local $copy i32)
    (local.set $payload (i32.add (local.get $ptr) (i32.add (local.get $sl) (local.get $hl))))
    (if (i32.eqz (local.get $pl)) (then (return (i32.const 0))))
    (local.set $c (i32.load8_u (local.get $payload)))
    (if (i32.eq (local.get $c) (i32.const 120)) (then (return (i32.const 1))))
    (if (i32.eq (local.get $c) (i32.const 33))
      (then (call $reject (i32.const 16) (i32.const 13)) (return (i32.const 2))))
    (if (i32.eq (local.get $c) (i32.const 36))
      (then
        (drop (call $emit (local.get $ptr) (local.get $sl)
                          (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                          (local.get $payload) (local.get $pl)))
        (drop (call $emit (i32.const 48) (i32.const 13)
                          (i32.const 0) (i32.const 0)
                          (i32.const 48) (i32.const 13)))
        (return (i32.const 3))))
    (if (i32.eq (local.get $c) (i32.const 42))
      (then
        ;; `<subject>.copy`, written after the input.
        (local.set $copy (i32.add (local.get $payload) (local.get $pl)))
        (memory.copy (local.get $copy) (local.get $ptr) (local.get $sl))
        (memory.copy (i32.add (local.get $copy) (local.get $sl)) (i32.const 32) (i32.const 5))
        (drop (call $emit (local.get $ptr) (local.get $sl)
                          (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                          (local.get $payload) (local.get $pl)))
        (drop (call $emit (local.get $copy) (i32.add (local.get $sl) (i32.const 5))
                          (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                          (local.get $payload) (local.get $pl)))
        (return (i32.const 3))))
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $pl)))
        (local.set $c (i32.load8_u (i32.add (local.get $payload) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (i32.store8 (i32.add (local.get $payload) (local.get $i))
                            (i32.sub (local.get $c) (i32.const 32)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
    (drop (call $emit (local.get $ptr) (local.get $sl)
                      (i32.add (local.get $ptr) (local.get $sl)) (local.get $hl)
                      (local.get $payload) (local.get $pl)))
    (i32.const 3)))
