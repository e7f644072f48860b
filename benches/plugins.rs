//! What a publish plugin costs per message (criterion): the whole chain a publish
//! goes through (`TenantPlugins::on_publish`: the pattern lookup, the input copied
//! into the instance, the call, the verdict), for a pass-through plugin and for one
//! that rewrites every byte of the payload and emits it (tests/plugins/edit.wat's
//! capitals), at 100-byte and 4-KiB payloads, against a tenant with no plugin; and
//! a JSON field transform from AssemblyScript (tests/plugins/redact.ts, built with
//! the `asc` that ./scripts/test-all.sh installs under tests/js) masking a "secret"
//! field of a JSON payload of the same sizes.
//!
//!     cargo bench --bench plugins

use std::sync::Arc;

use bytes::Bytes;
use canopy::plugins::{
    Hook, OnError, Outcome, Plugin, PluginSpec, Plugins, StoredPlugin, TenantPlugins,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const PASS: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "canopy_alloc") (param $len i32) (result i32)
    (local $pages i32)
    (local.set $pages (i32.shr_u (i32.add (local.get $len) (i32.const 66559)) (i32.const 16)))
    (if (i32.gt_u (local.get $pages) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $pages) (memory.size))))))
    (i32.const 1024))
  (func (export "on_publish") (param i32 i32 i32 i32) (result i32) (i32.const 0)))"#;

fn tenant_with(module: &[u8]) -> TenantPlugins {
    let stored = StoredPlugin {
        spec: PluginSpec {
            pattern: "bench.>".into(),
            hooks: vec![Hook::Publish],
            on_error: OnError::Reject,
            deadline_ms: 10,
            memory_mib: 16,
        },
        module: String::new(),
        version: 1,
        time_ms: 0,
        sha256: String::new(),
    };
    let plugin = Plugin::new(&stored, module, 1 << 20).expect("compiles");
    let tenant = TenantPlugins::default();
    tenant.set(Plugins::new(vec![Arc::new(plugin)]));
    tenant
}

/// tests/plugins/redact.ts built by AssemblyScript's `asc`.
fn assemblyscript_redact() -> Vec<u8> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let asc = root.join("tests/js/node_modules/.bin/asc");
    assert!(
        asc.exists(),
        "{} is missing: run ./scripts/test-all.sh once (it installs AssemblyScript)",
        asc.display()
    );
    let out = std::env::temp_dir().join(format!("canopy-bench-redact-{}.wasm", std::process::id()));
    let built = std::process::Command::new(&asc)
        .arg(root.join("tests/plugins/redact.ts"))
        .args(["--runtime", "incremental", "-O3", "-o"])
        .arg(&out)
        .output()
        .expect("asc runs");
    assert!(
        built.status.success(),
        "asc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let module = std::fs::read(&out).expect("built");
    let _ = std::fs::remove_file(&out);
    module
}

/// A JSON object of about `size` bytes with a "secret" field.
fn json_of(size: usize) -> Bytes {
    let head = r#"{"user":"ada","secret":"hunter2","note":""#;
    let pad = size.saturating_sub(head.len() + 2);
    Bytes::from(format!("{head}{}\"}}", "n".repeat(pad)))
}

fn bench(c: &mut Criterion) {
    let edit = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/plugins/edit.wat"
    ))
    .expect("edit.wat");
    let none = TenantPlugins::default();
    let pass = tenant_with(PASS.as_bytes());
    let transform = tenant_with(&edit);
    let redact = tenant_with(&assemblyscript_redact());
    let headers = Bytes::new();
    let mut group = c.benchmark_group("publish_plugin");
    for size in [100usize, 4096] {
        let payload = Bytes::from(vec![b'a'; size]);
        assert_eq!(
            pass.on_publish("bench.x", &headers, &payload),
            Outcome::Unchanged
        );
        assert!(matches!(
            transform.on_publish("bench.x", &headers, &payload),
            Outcome::Replaced(ref m) if m[0].payload[..] == vec![b'A'; size][..]
        ));
        group.bench_with_input(BenchmarkId::new("no plugin", size), &payload, |b, p| {
            b.iter(|| none.on_publish("bench.x", &headers, p))
        });
        group.bench_with_input(BenchmarkId::new("pass-through", size), &payload, |b, p| {
            b.iter(|| pass.on_publish("bench.x", &headers, p))
        });
        group.bench_with_input(
            BenchmarkId::new("capitals, emitted", size),
            &payload,
            |b, p| b.iter(|| transform.on_publish("bench.x", &headers, p)),
        );
        let json = json_of(size);
        assert!(matches!(
            redact.on_publish("bench.x", &headers, &json),
            Outcome::Replaced(ref m) if m[0].payload.windows(12).any(|w| w == br#""secret":"**"#)
        ));
        group.bench_with_input(
            BenchmarkId::new("JSON field masked (AssemblyScript)", size),
            &json,
            |b, p| b.iter(|| redact.on_publish("bench.x", &headers, p)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
