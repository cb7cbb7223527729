;; The guest's `fibonacci::naive` as rustc/LLVM emit it for wasm32 (one recursive call, the
;; other turned into a loop), written by hand so the bench can compile the very same function
;; with and without epoch interruption: how much of the fib ratio is wasmtime's, not our host's.
(module
  (func $naive (export "naive") (param $n i32) (result i64)
    (local $sum i64)
    (if (i32.lt_u (local.get $n) (i32.const 2))
      (then (return (i64.extend_i32_u (local.get $n)))))
    (loop $next
      (local.set $sum
        (i64.add (local.get $sum) (call $naive (i32.sub (local.get $n) (i32.const 1)))))
      (local.set $n (i32.sub (local.get $n) (i32.const 2)))
      (br_if $next (i32.gt_u (local.get $n) (i32.const 1))))
    (i64.add (local.get $sum) (i64.extend_i32_u (local.get $n)))))
