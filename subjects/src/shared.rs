//! The concurrent subscription trie: Left-Right over two [`Trie`] copies.
//!
//! Owns [`SharedTrie`]: readers (publishers matching a subject) never wait, never lock and
//! never write a shared cache line other than their own stripe of a read indicator; writers
//! (subscribe, unsubscribe) are serialised by a mutex and apply each change to both copies,
//! the second time at the start of the next write, when that copy's readers have left.
//! Must never let a reader see a copy while a writer changes it, never copy a whole trie,
//! and never be written to from inside a `visit` callback (the writer would wait forever for
//! that very reader to leave).
//!
//! Technique: Ramalhete & Correia, "Left-Right: A Concurrency Control Technique with
//! Wait-Free Population Oblivious Reads" (2015).
//!
//! ```text
//!  reader:  vi = version_index ─► arrive(indicator[vi]) ─► lr = left_right
//!           ─► match in instance[lr] ─► depart(indicator[vi])
//!  writer:  lock ─► wait indicator[!vi] empty ─► version_index = !vi
//!           ─► wait indicator[vi] empty           (the last readers of instance[!lr] left)
//!           ─► replay the previous write's ops on instance[!lr]
//!           ─► apply this write's ops to instance[!lr] ─► left_right = !lr
//!           ─► keep the ops for the next write ─► unlock
//! ```

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::pattern::Pattern;
use crate::trie::{QueueGroup, Trie};

/// Stripes per read indicator: readers on different threads mostly touch different lines.
const STRIPES: usize = 32;

/// One counter on its own cache line (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicUsize);

/// A read indicator striped over [`STRIPES`] counters; a reader uses its thread's stripe.
struct ReadIndicator {
    stripes: [Padded; STRIPES],
}

impl ReadIndicator {
    fn new() -> Self {
        ReadIndicator {
            stripes: std::array::from_fn(|_| Padded::default()),
        }
    }

    /// Is no reader inside? (A reader counted here may have arrived and departed on
    /// different stripes' views, but each reader arrives and departs on the same stripe.)
    fn is_empty(&self) -> bool {
        // SeqCst: these loads must be ordered after the writer's SeqCst store to
        // `left_right`/`version_index` in the single total order (see `SharedTrie::write`).
        self.stripes.iter().all(|s| s.0.load(Ordering::SeqCst) == 0)
    }

    /// Waits until no reader is counted here. Polls with a growing pause between scans, so
    /// that the writer does not keep stealing the readers' counter lines while they work.
    fn wait_empty(&self) {
        let mut pause = 1u32;
        while !self.is_empty() {
            if pause <= 64 {
                for _ in 0..pause {
                    std::hint::spin_loop();
                }
                pause *= 2;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// One copy of the trie, padded so the two copies share no cache line.
#[repr(align(128))]
struct Instance<T>(UnsafeCell<Trie<T>>);

/// The indices a reader loads, sharing one cache line so a write costs readers one miss.
#[repr(align(128))]
struct Indices {
    /// Which instance readers must use (0 or 1).
    left_right: AtomicUsize,
    /// Which read indicator new readers arrive on (0 or 1).
    version_index: AtomicUsize,
}

/// The stripe of the current thread, handed out round-robin when a thread first reads.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Relaxed: only uniqueness-ish spreading matters, not ordering.
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// A subscription trie that many threads match against while one at a time changes it.
///
/// Readers are wait-free (a fixed number of steps whatever the writers do); a change
/// becomes visible to every match that starts after the change returns. Memory is two
/// copies of the trie.
pub struct SharedTrie<T> {
    /// The two copies, each on cache lines of its own: the writer changes the header (slab
    /// length, free list) of one while readers read the other's.
    instances: [Instance<T>; 2],
    /// The two indices every reader loads, on one cache line of their own.
    index: Indices,
    indicators: [ReadIndicator; 2],
    /// Serialises writers and holds the ops the active instance has and the idle one
    /// does not have yet.
    writer: Mutex<Vec<Op<T>>>,
}

/// One change, kept until it is applied to the second instance too.
enum Op<T> {
    Insert(Pattern, Option<Box<str>>, T),
    Remove(Pattern, Option<Box<str>>, T),
}

impl<T: Clone + PartialEq> Op<T> {
    /// Applies the change; `op` runs once per instance and must leave both equal.
    fn apply(&self, trie: &mut Trie<T>) -> bool {
        match self {
            Op::Insert(pattern, queue, value) => {
                trie.insert(pattern, queue.as_deref(), value.clone());
                true
            }
            Op::Remove(pattern, queue, value) => trie.remove(pattern, queue.as_deref(), value),
        }
    }
}

// SAFETY: the instances are only written by the one writer holding `writer` (so `T` moves
// between threads: `T: Send`), and only read through `&Trie<T>` shared by many reader
// threads at once (`T: Sync`). The Left-Right protocol guarantees a writer never mutates an
// instance that a reader may be reading (see `write`).
unsafe impl<T: Send + Sync> Sync for SharedTrie<T> {}
// SAFETY: owning a SharedTrie is owning two `Trie<T>`, which is `Send` when `T: Send`; the
// atomics and mutex are `Send`.
unsafe impl<T: Send> Send for SharedTrie<T> {}

/// Departs from a read indicator when dropped, so a panicking `visit` still departs.
struct Departure<'a> {
    counter: &'a AtomicUsize,
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        // SeqCst (Release would do): everything this reader read in the instance happens
        // before a writer's SeqCst load that sees the decremented count, so the writer's
        // later mutation of that instance cannot race with those reads.
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T: Clone + PartialEq + Send + Sync> Default for SharedTrie<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + PartialEq + Send + Sync> SharedTrie<T> {
    /// An empty shared trie.
    pub fn new() -> Self {
        SharedTrie {
            instances: [
                Instance(UnsafeCell::new(Trie::new())),
                Instance(UnsafeCell::new(Trie::new())),
            ],
            index: Indices {
                left_right: AtomicUsize::new(0),
                version_index: AtomicUsize::new(0),
            },
            indicators: [ReadIndicator::new(), ReadIndicator::new()],
            writer: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op<T>>> {
        // A poisoned lock means a writer panicked inside a `Trie` operation, which does not
        // panic on any input; carry on rather than take every subscriber down with it.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `ops` to the instance readers do not use and makes it the one they use.
    /// The other instance catches up at the start of the next write, by which time its
    /// last readers have usually left, so a writer rarely waits for a reader. Returns how
    /// many ops changed the trie.
    fn write(&self, ops: impl IntoIterator<Item = Op<T>>) -> usize {
        let mut pending = self.lock();
        // Relaxed would do: only writers store `left_right`, and we hold the writer lock.
        let lr = self.index.left_right.load(Ordering::SeqCst);
        let other = lr ^ 1;
        // Readers that loaded `left_right == other` before the previous write flipped it
        // may still be inside `instances[other]`: wait for them. Toggle the version in two
        // halves so that a reader that read `version_index` long ago and arrives late on
        // either indicator is still waited for (the paper's proof). Doing this now rather
        // than right after the flip only makes us wait for more readers, all of which
        // loaded `left_right == lr`.
        let vi = self.index.version_index.load(Ordering::SeqCst);
        let next = vi ^ 1;
        self.indicators[next].wait_empty();
        self.index.version_index.store(next, Ordering::SeqCst);
        self.indicators[vi].wait_empty();
        // SAFETY: `left_right == lr` was stored by the previous write (or `new`), and both
        // indicators were then seen empty (SeqCst loads after that store), so every reader
        // that loaded `left_right == other` has departed (its reads happen-before its SeqCst
        // departure, which our loads observed), and every reader since loads `lr`. We hold
        // the writer lock, so no other `&mut` exists.
        let idle = unsafe { &mut *self.instances[other].0.get() };
        for op in pending.drain(..) {
            op.apply(idle);
        }
        let mut changed = 0;
        for op in ops {
            changed += usize::from(op.apply(idle));
            pending.push(op);
        }
        // SeqCst: in the single total order, any reader whose `left_right` load comes after
        // this store reads `other`; any reader whose load came before it arrived (SeqCst RMW)
        // before its load, hence before this store, hence before the next write's indicator
        // loads, which therefore see it and wait for its departure.
        self.index.left_right.store(other, Ordering::SeqCst);
        changed
    }

    /// Adds a subscription; every match that starts after this returns sees it.
    pub fn insert(&self, pattern: &Pattern, queue: Option<&str>, value: T) {
        self.write([Op::Insert(pattern.clone(), queue.map(Box::from), value)]);
    }

    /// Removes one subscription; returns whether there was one.
    pub fn remove(&self, pattern: &Pattern, queue: Option<&str>, value: &T) -> bool {
        self.write([Op::Remove(
            pattern.clone(),
            queue.map(Box::from),
            value.clone(),
        )]) > 0
    }

    /// Adds many subscriptions for the cost of one synchronisation with readers.
    pub fn insert_many(&self, items: &[(Pattern, Option<Box<str>>, T)]) {
        self.write(
            items
                .iter()
                .map(|(p, q, v)| Op::Insert(p.clone(), q.clone(), v.clone())),
        );
    }

    /// Removes many subscriptions for the cost of one synchronisation with readers;
    /// returns how many were found.
    pub fn remove_many(&self, items: &[(Pattern, Option<Box<str>>, T)]) -> usize {
        self.write(
            items
                .iter()
                .map(|(p, q, v)| Op::Remove(p.clone(), q.clone(), v.clone())),
        )
    }

    /// Runs `read` on the instance readers may use, wait-free.
    fn read<R>(&self, read: impl FnOnce(&Trie<T>) -> R) -> R {
        // SeqCst: ordered before our arrival in the total order (the paper's reader).
        let vi = self.index.version_index.load(Ordering::SeqCst) & 1;
        let counter = &self.indicators[vi].stripes[stripe()].0;
        // SeqCst RMW: ordered before our `left_right` load, so a writer that stores
        // `left_right` after our load sees our arrival (see `write`).
        counter.fetch_add(1, Ordering::SeqCst);
        let _departure = Departure { counter };
        let lr = self.index.left_right.load(Ordering::SeqCst) & 1;
        // SAFETY: we are counted on an indicator the writer waits on before it mutates
        // `instances[lr]` (see `write`), and we stay counted until `_departure` drops, after
        // the last use of this reference (it does not escape `read`).
        let trie = unsafe { &*self.instances[lr].0.get() };
        read(trie)
    }

    /// Calls `visit` once per matching node that holds subscribers (see
    /// [`Trie::for_each_match`]). Wait-free; allocates nothing. `visit` must not write to
    /// this same `SharedTrie` (it would deadlock).
    pub fn for_each_match(&self, subject: &str, visit: &mut impl FnMut(&[T], &[QueueGroup<T>])) {
        self.read(|t| t.for_each_match(subject, visit));
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.read(Trie::len)
    }

    /// Does it hold no subscription?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of trie nodes in one copy (for memory figures).
    pub fn node_count(&self) -> usize {
        self.read(Trie::node_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    fn p(s: &str) -> Pattern {
        Pattern::parse_native(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn is_send_and_sync() {
        fn check<X: Send + Sync>() {}
        check::<SharedTrie<u64>>();
    }

    #[test]
    fn basic() {
        let t = SharedTrie::new();
        t.insert(&p("a.*"), None, 1u32);
        t.insert(&p("a.b"), Some("q"), 2);
        let mut seen = Vec::new();
        t.for_each_match("a.b", &mut |plain, queues| {
            seen.extend_from_slice(plain);
            seen.extend(queues.iter().flat_map(|q| q.members.iter().copied()));
        });
        seen.sort_unstable();
        assert_eq!(seen, vec![1, 2]);
        assert!(t.remove(&p("a.*"), None, &1));
        assert!(!t.remove(&p("a.*"), None, &1));
        assert_eq!(t.len(), 1);
        let batch: Vec<_> = (0..10u32)
            .map(|i| (p(&format!("x.{i}")), None, i))
            .collect();
        t.insert_many(&batch);
        assert_eq!(t.len(), 11);
        assert_eq!(t.remove_many(&batch), 10);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn panicking_reader_departs() {
        let t = Arc::new(SharedTrie::new());
        t.insert(&p("a"), None, 1u32);
        let t2 = Arc::clone(&t);
        let r = std::thread::spawn(move || {
            t2.for_each_match("a", &mut |_, _| panic!("reader panics on purpose"));
        })
        .join();
        assert!(r.is_err());
        // Would hang if the panicking reader had stayed counted.
        t.insert(&p("b"), None, 2);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn readers_always_see_fixed_subscription_while_writers_churn() {
        let t = Arc::new(SharedTrie::new());
        t.insert(&p("fixed.>"), None, u64::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for r in 0..3u64 {
            let t = Arc::clone(&t);
            let stop = Arc::clone(&stop);
            handles.push(std::thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let subject = format!("fixed.{}", rounds % 50);
                    let mut fixed = 0;
                    let mut others = 0;
                    t.for_each_match(&subject, &mut |plain, _| {
                        fixed += plain.iter().filter(|&&v| v == u64::MAX).count();
                        others += plain.iter().filter(|&&v| v != u64::MAX).count();
                    });
                    assert_eq!(fixed, 1, "reader {r} round {rounds}");
                    assert!(others <= 2, "at most fixed.N and fixed.* besides");
                    rounds += 1;
                }
                rounds
            }));
        }
        for w in 0..2u64 {
            let t = Arc::clone(&t);
            handles.push(std::thread::spawn(move || {
                for i in 0..4_000u64 {
                    let pat = if i % 3 == 0 {
                        p("fixed.*")
                    } else {
                        p(&format!("fixed.{}", i % 50))
                    };
                    let id = w * 1_000_000 + i;
                    t.insert(&pat, None, id);
                    assert!(t.remove(&pat, None, &id));
                }
                0
            }));
        }
        let writers: Vec<_> = handles.split_off(3);
        for h in writers {
            assert!(h.join().is_ok());
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            assert!(h.join().is_ok_and(|rounds| rounds > 0));
        }
        assert_eq!(t.len(), 1);
    }
}
