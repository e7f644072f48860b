//! The consumer-group dispatcher's cost per ack with many subjects pending (issue 15:
//! an ack must cost the same whatever the backlog). Each iteration takes one message
//! for a member and acks it, with 1,000, 100,000 or 1,000,000 subjects holding
//! pending messages (each subject two versions pending, one in flight at a time).
//!
//! Run: `cargo bench --bench groups`.

use std::sync::Arc;

use canopy::groups::Limits;
use canopy::groups::dispatch::Dispatcher;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn loaded(subjects: usize) -> Dispatcher {
    let limits = Limits {
        ack_wait_ms: 30_000,
        max_deliveries: 0,
        per_subject: 1,
        per_member: 1_000_000,
    };
    let mut group = Dispatcher::new(limits, true);
    for i in 0..subjects {
        let subject: Arc<str> = Arc::from(format!("orders.{i}"));
        group.restore(subject, 0, 1_000_000);
    }
    group.join(1);
    group
}

fn take_and_ack(c: &mut Criterion) {
    let mut bench = c.benchmark_group("group take+ack");
    for subjects in [1_000usize, 100_000, 1_000_000] {
        let mut group = loaded(subjects);
        let mut now = 0u64;
        bench.bench_with_input(BenchmarkId::from_parameter(subjects), &subjects, |b, _| {
            b.iter(|| {
                now += 1;
                let delivery = group.take(1, 1, now);
                for d in &delivery {
                    let _ = group.ack(d, now);
                }
                delivery.len()
            });
        });
        // Keep the backlog around: every ack above moved one cursor.
        let _ = group.take_cursors();
    }
    bench.finish();
}

fn ack_with_many_in_flight(c: &mut Criterion) {
    // 100,000 messages outstanding at once: the ack's timer and in-flight lookups.
    let mut bench = c.benchmark_group("group ack, 100k in flight");
    let mut group = loaded(100_000);
    let mut now = 0u64;
    let mut out = std::collections::VecDeque::from(group.take(1, 100_000, now));
    bench.bench_function("ack then take", |b| {
        b.iter(|| {
            now += 1;
            if let Some(d) = out.pop_front() {
                let _ = group.ack(&d, now);
            }
            out.extend(group.take(1, 1, now));
        });
    });
    bench.finish();
}

criterion_group!(benches, take_and_ack, ack_with_many_in_flight);
criterion_main!(benches);
