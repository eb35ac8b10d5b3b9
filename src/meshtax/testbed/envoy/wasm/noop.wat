;; A no-op proxy-wasm HTTP filter: every callback returns "continue" and touches nothing.
;; Exports the ABI marker Envoy uses to pick the ABI (proxy_abi_version_0_2_0), an allocator
;; the host may call to pass data in (a bump allocator that grows memory), and the callbacks
;; an HTTP filter context goes through. No imports: the module calls no host function.
(module
  (memory (export "memory") 2)
  ;; first free byte; page 0 stays for the stack-less data we never use
  (global $heap (mut i32) (i32.const 65536))

  (func (export "proxy_abi_version_0_2_0"))

  ;; (size) -> pointer; 8-byte aligned, grows memory when full, 0 on failure
  (func $alloc (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $ptr i32)
    (local $end i32)
    (local.set $ptr (global.get $heap))
    (local.set $end (i32.and (i32.add (i32.add (local.get $ptr) (local.get $size)) (i32.const 7))
                             (i32.const -8)))
    (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
      (then
        (if (i32.eq
              (memory.grow (i32.add (i32.shr_u (i32.sub (local.get $end)
                                                        (i32.mul (memory.size) (i32.const 65536)))
                                               (i32.const 16))
                                    (i32.const 1)))
              (i32.const -1))
          (then (return (i32.const 0))))))
    (global.set $heap (local.get $end))
    (local.get $ptr))

  ;; root context: accept any VM and plugin configuration
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_context_create") (param i32 i32))

  ;; stream callbacks: 0 = Action::Continue
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_request_trailers") (param i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_trailers") (param i32 i32) (result i32) (i32.const 0))

  ;; teardown: done immediately (1 = true), nothing to free
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32))
)
