;; A publish plugin that misbehaves by its payload's first byte: `l` loops for ever,
;; `t` traps, `m` asks for memory without end (and aborts when refused, as
;; AssemblyScript's allocator does); anything else passes.
(module
  (memory (export "memory") 1)
  (func (export "canopy_alloc") (param $len i32) (result i32)
    (if (i32.gt_u (i32.add (local.get $len) (i32.const 1024)) (i32.const 65536))
      (then (unreachable)))
    (i32.const 1024))
  (func (export "on_publish")
        (param $ptr i32) (param $sl i32) (param $hl i32) (param $pl i32) (result i32)
    (local $c i32)
    (if (i32.eqz (local.get $pl)) (then (return (i32.const 0))))
    (local.set $c (i32.load8_u (i32.add (local.get $ptr) (i32.add (local.get $sl) (local.get $hl)))))
    (if (i32.eq (local.get $c) (i32.const 108))
      (then (loop $ever (br $ever))))
    (if (i32.eq (local.get $c) (i32.const 116))
      (then (unreachable)))
    (if (i32.eq (local.get $c) (i32.const 109))
      (then
        (loop $more
          (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
        (unreachable)))
    (i32.const 0)))
