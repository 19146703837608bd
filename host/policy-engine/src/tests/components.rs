//! Small components written in component text, for tests that must not depend on the guest
//! toolchain: a router that asks the ring (or its `pin` config key), and routers that trap,
//! loop, allocate forever, answer nonsense or import what they may not; an admission policy
//! and a safety filter.
//!
//! Memory layout shared by the core modules: static data below 256, the answer at 256, import
//! results at 288 and 320, and a bump allocator from 1024 that `reset` rewinds after each call.

/// `ringmaster:policy/types.request` and `router.decision`, exported so the function types
/// that use them are named (the component model requires it).
const ROUTER_TYPES: &str = r#"
  (type $request' (record
    (field "id" string) (field "model" string) (field "tier" string)
    (field "session-id" (option string)) (field "routing-key" u64)
    (field "prefix-hashes" (list u64)) (field "prompt-tokens" u32) (field "max-tokens" u32)
    (field "priority" u8) (field "stream" bool) (field "headers" (list (tuple string string)))))
  (export $request "request" (type $request'))
  (type $decision' (variant (case "route" string) (case "reject" string)))
  (export $decision "decision" (type $decision'))
"#;

/// Memory, a bump `realloc` and `reset`. `start` is an optional start-function body.
fn libc(start: &str) -> String {
    let start = if start.is_empty() {
        String::new()
    } else {
        format!("(func $start {start}) (start $start)")
    };
    format!(
        r#"
  (core module $libc
    (memory (export "memory") 1)
    (global $bump (mut i32) (i32.const 1024))
    (func (export "reset") (global.set $bump (i32.const 1024)))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and
        (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (if (i32.gt_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
        (then (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))))
      (local.get $p))
    {start})
  (core instance $libc (instantiate $libc))
"#
    )
}

/// How a test router behaves.
#[derive(Clone, Copy, Debug)]
pub enum Router<'a> {
    /// Counts `routed_total`, routes to config `pin` if set, else to `ring.lookup(key)`, else
    /// rejects. Traps when the key is `0xdead`.
    Lookup,
    /// Always answers `route("no-such-server")`.
    Nonsense,
    /// Always traps (like a Rust panic under `panic = "abort"`).
    Panics,
    /// Never returns.
    LoopForever,
    /// Grows memory until refused, then traps (like a failed allocation).
    AllocForever,
    /// Traps in its start function, while being instantiated.
    TrapOnStart,
    /// `Lookup`, with one more import (component text of an `import`).
    ExtraImport(&'a str),
}

/// A router component.
pub fn router(kind: Router<'_>) -> Vec<u8> {
    let lookup = r#"
      (if (i64.eq (local.get $key) (i64.const 0xdead)) (then unreachable))
      (call $count (i32.const 16) (i32.const 12) (i64.const 1))
      (call $config (i32.const 32) (i32.const 3) (i32.const 288))
      (if (i32.load8_u (i32.const 288))
        (then (call $route_to (i32.load (i32.const 292)) (i32.load (i32.const 296))))
        (else
          (call $lookup (local.get $key) (i32.const 320))
          (if (i32.load8_u (i32.const 320))
            (then (call $route_to (i32.load (i32.const 324)) (i32.load (i32.const 328))))
            (else (call $reject (i32.const 48) (i32.const 10))))))"#;
    let (body, start, extra) = match kind {
        Router::Lookup => (lookup, "", ""),
        Router::ExtraImport(import) => (lookup, "", import),
        Router::Nonsense => ("(call $route_to (i32.const 64) (i32.const 14))", "", ""),
        Router::Panics => ("unreachable", "", ""),
        Router::LoopForever => ("(loop $l (br $l))", "", ""),
        Router::AllocForever => (
            "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) unreachable",
            "",
            "",
        ),
        Router::TrapOnStart => (lookup, "unreachable", ""),
    };
    let libc = libc(start);
    let text = format!(
        r#"(component
  {ROUTER_TYPES}
  (import "ringmaster:policy/ring@0.1.0" (instance $ring
    (export "lookup" (func (param "key" u64) (result (option string))))))
  (import "ringmaster:policy/metrics@0.1.0" (instance $metrics
    (export "counter-add" (func (param "name" string) (param "value" u64)))))
  (import "ringmaster:policy/config@0.1.0" (instance $config
    (export "get" (func (param "key" string) (result (option string))))))
  {extra}
  {libc}
  (core func $lookup_c (canon lower (func $ring "lookup")
    (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
  (core func $count_c (canon lower (func $metrics "counter-add") (memory (core memory $libc "memory"))))
  (core func $config_c (canon lower (func $config "get")
    (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
  (core module $main
    (import "libc" "memory" (memory 1))
    (import "libc" "reset" (func $reset))
    (import "host" "lookup" (func $lookup (param i64 i32)))
    (import "host" "counter-add" (func $count (param i32 i32 i64)))
    (import "host" "config-get" (func $config (param i32 i32 i32)))
    (data (i32.const 16) "routed_total")
    (data (i32.const 32) "pin")
    (data (i32.const 48) "empty ring")
    (data (i32.const 64) "no-such-server")
    (func $route_to (param i32 i32)
      (i32.store8 (i32.const 256) (i32.const 0))
      (i32.store (i32.const 260) (local.get 0))
      (i32.store (i32.const 264) (local.get 1)))
    (func $reject (param i32 i32)
      (i32.store8 (i32.const 256) (i32.const 1))
      (i32.store (i32.const 260) (local.get 0))
      (i32.store (i32.const 264) (local.get 1)))
    (func (export "route") (param $req i32) (result i32)
      (local $key i64)
      (local.set $key (i64.load offset=40 (local.get $req)))
      {body}
      (call $reset)
      (i32.const 256)))
  (core instance $main (instantiate $main
    (with "libc" (instance $libc))
    (with "host" (instance
      (export "lookup" (func $lookup_c))
      (export "counter-add" (func $count_c))
      (export "config-get" (func $config_c))))))
  (func (export "route") (param "req" $request) (result $decision)
    (canon lift (core func $main "route") (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
)"#
    );
    wat::parse_str(&text).unwrap_or_else(|e| panic!("router component text: {e}\n{text}"))
}

/// An admission policy: rejects when the queue is full (retry after 250 ms), queues when no
/// server is healthy, else accepts with the request's priority.
pub fn admission() -> Vec<u8> {
    let libc = libc("");
    let text = format!(
        r#"(component
  {ROUTER_TYPES}
  (type $load' (record (field "in-flight" u32) (field "queued" u32)
    (field "queue-capacity" u32) (field "servers" u32)))
  (export $load "load" (type $load'))
  (type $rejection' (record (field "reason" string) (field "retry-after-ms" u32)))
  (export $rejection "rejection" (type $rejection'))
  (type $verdict' (variant (case "accept" u8) (case "queue") (case "reject" $rejection)))
  (export $verdict "verdict" (type $verdict'))
  {libc}
  (core module $main
    (import "libc" "memory" (memory 1))
    (import "libc" "reset" (func $reset))
    (data (i32.const 16) "queue full")
    (func (export "admit") (param $args i32) (result i32)
      (call $reset)
      (if (i32.ge_u (i32.load offset=84 (local.get $args)) (i32.load offset=88 (local.get $args)))
        (then
          (i32.store8 (i32.const 256) (i32.const 2))
          (i32.store (i32.const 260) (i32.const 16))
          (i32.store (i32.const 264) (i32.const 10))
          (i32.store (i32.const 268) (i32.const 250))
          (return (i32.const 256))))
      (if (i32.eqz (i32.load offset=92 (local.get $args)))
        (then
          (i32.store8 (i32.const 256) (i32.const 1))
          (return (i32.const 256))))
      (i32.store8 (i32.const 256) (i32.const 0))
      (i32.store8 (i32.const 260) (i32.load8_u offset=64 (local.get $args)))
      (i32.const 256)))
  (core instance $main (instantiate $main (with "libc" (instance $libc))))
  (func (export "admit") (param "req" $request) (param "current" $load) (result $verdict)
    (canon lift (core func $main "admit") (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
)"#
    );
    wat::parse_str(&text).unwrap_or_else(|e| panic!("admission component text: {e}\n{text}"))
}

/// A safety filter: blocks text that starts with `!`, traps on text that starts with `#`.
pub fn safety() -> Vec<u8> {
    let libc = libc("");
    let text = format!(
        r#"(component
  (type $verdict' (variant (case "allow") (case "block" string)))
  (export $verdict "verdict" (type $verdict'))
  {libc}
  (core module $main
    (import "libc" "memory" (memory 1))
    (import "libc" "reset" (func $reset))
    (data (i32.const 16) "shouting")
    (func $check (param $ptr i32) (param $len i32) (result i32)
      (call $reset)
      (i32.store8 (i32.const 256) (i32.const 0))
      (if (i32.eqz (local.get $len)) (then (return (i32.const 256))))
      (if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 35)) (then unreachable))
      (if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 33))
        (then
          (i32.store8 (i32.const 256) (i32.const 1))
          (i32.store (i32.const 260) (i32.const 16))
          (i32.store (i32.const 264) (i32.const 8))))
      (i32.const 256))
    (func (export "check-input") (param i32 i32) (result i32)
      (call $check (local.get 0) (local.get 1)))
    (func (export "check-output") (param i32 i32 i32) (result i32)
      (call $check (local.get 0) (local.get 1))))
  (core instance $main (instantiate $main (with "libc" (instance $libc))))
  (func (export "check-input") (param "text" string) (result $verdict)
    (canon lift (core func $main "check-input") (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
  (func (export "check-output") (param "window" string) (param "final" bool) (result $verdict)
    (canon lift (core func $main "check-output") (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
)"#
    );
    wat::parse_str(&text).unwrap_or_else(|e| panic!("safety component text: {e}\n{text}"))
}

/// A component exporting `route` with the wrong type (`func(x: u32) -> u32`).
pub fn route_with_the_wrong_type() -> Vec<u8> {
    let text = r#"(component
  (core module $m (func (export "f") (param i32) (result i32) (local.get 0)))
  (core instance $i (instantiate $m))
  (func (export "route") (param "x" u32) (result u32) (canon lift (core func $i "f"))))"#;
    wat::parse_str(text).unwrap_or_else(|e| panic!("component text: {e}\n{text}"))
}
