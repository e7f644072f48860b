//! Benchmarks of the subscription trie on a fixed, documented corpus.
//!
//! Owns the figures quoted for `Trie` and `SharedTrie`: matching on NATS's own sublist
//! corpus and on 1M `orders.<i>.created` subscriptions, subscribe/unsubscribe rates, bytes
//! per subscription (counted by a global allocator), and matching throughput with readers
//! and a concurrent writer. Must never assert on timings; it only prints them.
//!
//! Run: `CARGO_TARGET_DIR=/work/main/target/subjects cargo bench -p canopy-subjects --bench trie`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use canopy_subjects::{Pattern, QueueGroup, SharedTrie, Trie};
use criterion::Criterion;

/// Counts live heap bytes (as requested; the allocator's own rounding is not included).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Live bytes as glibc malloc would hold them: 8 bytes of header, 16-byte rounding, 32 minimum.
static CHUNKS: AtomicUsize = AtomicUsize::new(0);

fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

// SAFETY: forwards every call to `System` unchanged and only counts sizes on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_add(chunk(new_size), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn pat(s: &str) -> Pattern {
    match Pattern::parse_native(s) {
        Ok(p) => p,
        Err(e) => panic!("bench corpus pattern {s}: {e}"),
    }
}

/// NATS's sublist benchmark corpus: every sequence of 1 to 5 of eight tokens (37,448
/// literal subscriptions) plus three wildcard patterns.
fn nats_corpus() -> Vec<Pattern> {
    const TOKENS: [&str; 8] = [
        "synadia",
        "nats",
        "jetstream",
        "nkeys",
        "jwt",
        "deny",
        "auth",
        "drain",
    ];
    let mut out = Vec::new();
    let mut level: Vec<String> = vec![String::new()];
    for _ in 0..5 {
        let mut next = Vec::new();
        for prefix in &level {
            for t in TOKENS {
                let s = if prefix.is_empty() {
                    t.to_owned()
                } else {
                    format!("{prefix}.{t}")
                };
                out.push(pat(&s));
                next.push(s);
            }
        }
        level = next;
    }
    for w in ["cloud.>", "cloud.nats.component.>", "cloud.*.*.nkeys.*"] {
        out.push(pat(w));
    }
    out
}

const ORDERS: usize = 1_000_000;

/// 1M literal `orders.<i>.created` plus 500 wildcard patterns.
fn orders_corpus() -> Vec<Pattern> {
    let mut out: Vec<Pattern> = (0..ORDERS)
        .map(|i| pat(&format!("orders.{i}.created")))
        .collect();
    out.extend(wildcards_500());
    out
}

fn wildcards_500() -> Vec<Pattern> {
    let mut out = vec![pat("orders.*.created"), pat("orders.>"), pat("orders.*.*")];
    let mut k = 0usize;
    while out.len() < 500 {
        out.push(match k % 4 {
            0 => pat(&format!("orders.{}.>", k * 1999)),
            1 => pat(&format!("orders.{}.*", k * 2003)),
            2 => pat(&format!("orders.*.shipped{k}")),
            _ => pat(&format!("audit{k}.*.created")),
        });
        k += 1;
    }
    out
}

/// A fixed pseudo-random sequence (xorshift), so runs compare.
fn randoms(n: usize, below: usize) -> Vec<usize> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % below as u64) as usize
        })
        .collect()
}

fn count(plain: &[u64], queues: &[QueueGroup<u64>], n: &mut usize) {
    *n += plain.len() + queues.len();
}

fn shared_of(patterns: &[Pattern]) -> SharedTrie<u64> {
    let t = SharedTrie::new();
    for chunk in patterns.chunks(4096).enumerate() {
        let (c, ps) = chunk;
        let batch: Vec<_> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), None, (c * 4096 + i) as u64))
            .collect();
        t.insert_many(&batch);
    }
    t
}

fn trie_of(patterns: &[Pattern]) -> Trie<u64> {
    let mut t = Trie::new();
    for (i, p) in patterns.iter().enumerate() {
        t.insert(p, None, i as u64);
    }
    t
}

fn bench_nats(c: &mut Criterion) {
    let corpus = nats_corpus();
    let shared = shared_of(&corpus);
    let trie = trie_of(&corpus);
    eprintln!("nats corpus: {} subscriptions", shared.len());
    let queries = [
        ("hit", "synadia.nats.jetstream.nkeys", 1),
        ("two_results", "cloud.nats.component.router", 2),
        ("miss", "synadia.nats.jetstream.nkeys.ZZZZ", 0),
    ];
    let mut g = c.benchmark_group("nats_corpus");
    for (name, subject, expected) in queries {
        let mut n = 0;
        shared.for_each_match(subject, &mut |p, q| count(p, q, &mut n));
        assert_eq!(n, expected, "{subject}");
        g.bench_function(format!("shared/{name}"), |b| {
            b.iter(|| {
                let mut n = 0;
                shared.for_each_match(black_box(subject), &mut |p, q| count(p, q, &mut n));
                n
            })
        });
        g.bench_function(format!("trie/{name}"), |b| {
            b.iter(|| {
                let mut n = 0;
                trie.for_each_match(black_box(subject), &mut |p, q| count(p, q, &mut n));
                n
            })
        });
    }
    g.finish();
}

fn bench_orders(c: &mut Criterion) {
    let corpus = orders_corpus();

    let before = LIVE.load(Ordering::Relaxed);
    let chunks_before = CHUNKS.load(Ordering::Relaxed);
    let start = Instant::now();
    let shared = shared_of(&corpus);
    let built = start.elapsed();
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let chunks = CHUNKS.load(Ordering::Relaxed) - chunks_before;
    eprintln!(
        "orders: SharedTrie of {} subscriptions built (batches of 4096) in {:.2?} ({:.0} ns/sub); \
         {} bytes requested = {:.1} bytes per subscription for both copies \
         ({:.1} with glibc's per-allocation overhead); {} nodes per copy",
        shared.len(),
        built,
        built.as_nanos() as f64 / corpus.len() as f64,
        bytes,
        bytes as f64 / corpus.len() as f64,
        chunks as f64 / corpus.len() as f64,
        shared.node_count(),
    );

    let before = LIVE.load(Ordering::Relaxed);
    let trie = trie_of(&corpus);
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    eprintln!(
        "orders: Trie: {:.1} bytes per subscription (one copy)",
        bytes as f64 / corpus.len() as f64
    );

    let existing: Vec<String> = randoms(8192, ORDERS)
        .into_iter()
        .map(|i| format!("orders.{i}.created"))
        .collect();
    let missing: Vec<String> = randoms(8192, ORDERS)
        .into_iter()
        .map(|i| format!("orders.{}.created", ORDERS + i))
        .collect();
    let mut n = 0;
    shared.for_each_match(&existing[0], &mut |p, q| count(p, q, &mut n));
    eprintln!("orders: a random existing subject matches {n} nodes' subscriber lists");

    let mut g = c.benchmark_group("orders_1m");
    for (name, subjects) in [("existing", &existing), ("missing", &missing)] {
        g.bench_function(format!("shared/{name}"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 8191;
                let mut n = 0;
                shared.for_each_match(&subjects[i], &mut |p, q| count(p, q, &mut n));
                n
            })
        });
        g.bench_function(format!("trie/{name}"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 8191;
                let mut n = 0;
                trie.for_each_match(&subjects[i], &mut |p, q| count(p, q, &mut n));
                n
            })
        });
    }
    let extra = pat("orders.extra.created");
    g.bench_function("shared/insert_then_remove", |b| {
        b.iter(|| {
            shared.insert(&extra, None, u64::MAX);
            shared.remove(&extra, None, &u64::MAX)
        })
    });
    g.finish();
    drop(trie);

    sub_unsub_rate(&shared);
    contention(Arc::new(shared), &existing);
}

/// Subscribe/unsubscribe operations per second on a loaded SharedTrie, one at a time.
fn sub_unsub_rate(shared: &SharedTrie<u64>) {
    const N: usize = 200_000;
    let patterns: Vec<Pattern> = (0..N).map(|i| pat(&format!("rate.{i}.created"))).collect();
    let start = Instant::now();
    for (i, p) in patterns.iter().enumerate() {
        shared.insert(p, None, i as u64);
    }
    let ins = start.elapsed();
    let start = Instant::now();
    for (i, p) in patterns.iter().enumerate() {
        shared.remove(p, None, &(i as u64));
    }
    let rem = start.elapsed();
    eprintln!(
        "SharedTrie (1M loaded), one op per call: subscribe {:.2} M ops/s ({:.0} ns), \
         unsubscribe {:.2} M ops/s ({:.0} ns)",
        N as f64 / ins.as_secs_f64() / 1e6,
        ins.as_nanos() as f64 / N as f64,
        N as f64 / rem.as_secs_f64() / 1e6,
        rem.as_nanos() as f64 / N as f64,
    );
}

/// Matches per second with 1 and 2 reader threads, with and without a writer thread that
/// subscribes and unsubscribes in a loop.
fn contention(shared: Arc<SharedTrie<u64>>, subjects: &[String]) {
    let subjects: Arc<Vec<String>> = Arc::new(subjects.to_vec());
    for readers in [1usize, 2] {
        for writer in [false, true] {
            let stop = Arc::new(AtomicBool::new(false));
            let writes = Arc::new(AtomicUsize::new(0));
            let w = writer.then(|| {
                let (shared, stop, writes) =
                    (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&writes));
                std::thread::spawn(move || {
                    let patterns: Vec<Pattern> = (0..1024)
                        .map(|i| pat(&format!("orders.{i}.updated")))
                        .collect();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let p = &patterns[i & 1023];
                        shared.insert(p, None, i as u64);
                        shared.remove(p, None, &(i as u64));
                        i += 1;
                    }
                    writes.store(2 * i, Ordering::Relaxed);
                })
            });
            let start = Instant::now();
            let handles: Vec<_> = (0..readers)
                .map(|r| {
                    let (shared, subjects) = (Arc::clone(&shared), Arc::clone(&subjects));
                    std::thread::spawn(move || {
                        let deadline = Instant::now() + Duration::from_millis(1500);
                        let mut done = 0usize;
                        let mut i = r * 4096;
                        while Instant::now() < deadline {
                            for _ in 0..256 {
                                i = (i + 1) & 8191;
                                let mut n = 0;
                                shared
                                    .for_each_match(&subjects[i], &mut |p, q| count(p, q, &mut n));
                                black_box(n);
                            }
                            done += 256;
                        }
                        done
                    })
                })
                .collect();
            let total: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
            let secs = start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            if let Some(w) = w {
                let _ = w.join();
            }
            let wr = writes.load(Ordering::Relaxed);
            eprintln!(
                "contention: {readers} reader(s){}: {:.2} M matches/s total{}",
                if writer { " + 1 writer" } else { "" },
                total as f64 / secs / 1e6,
                if writer {
                    format!(", writer {:.2} M ops/s", wr as f64 / secs / 1e6)
                } else {
                    String::new()
                },
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    bench_nats(&mut c);
    bench_orders(&mut c);
    c.final_summary();
}
