//! The store's journal as a whole: two journal files that take turns, and what
//! happens to them when the store opens (the rounds the engine lost are written to it
//! again, then both files start over).
//!
//! A round's record goes to the active file. When it is full, the other file starts
//! over and becomes the active one, but only once the engine holds, durably, every
//! round the other file has: the engine's own log is flushed behind the acks, so by
//! then it nearly always does, and the appender waits for it otherwise. Each round's
//! engine write also puts [`ROUND_KEY`], its round number: at start, what the engine
//! holds says which records to write again.
//!
//! Must never: start over a file holding a round the engine may not hold durably, or
//! open a store while a journal record it should hold cannot be read back.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::journal::{Journal, JournalError, JournaledRound};
use super::writes::Writes;
use super::{Engine, StoreError};

/// The engine key holding the number of the last journal round written to it.
pub(super) const ROUND_KEY: &[u8] = b"xjournal";

/// The two files a journal folder holds.
const FILES: [&str; 2] = ["a.journal", "b.journal"];

/// Where a store's journal lives: a folder beside the engine's.
pub(super) fn folder_of(store_folder: &Path) -> PathBuf {
    store_folder.join("journal")
}

/// Two journal files, one appended to at a time.
pub(crate) struct JournalPair {
    folder: PathBuf,
    files: [Journal; 2],
    /// The last round each file holds since it started over (0: none).
    last: [u64; 2],
    active: usize,
}

/// Where an appended round went.
pub(crate) enum Appended {
    /// The file to sync for it.
    In(Arc<std::fs::File>),
    /// The active file is full: the other must start over first, once the engine
    /// durably holds this round and every one before it.
    Full { wait_for: u64 },
}

impl JournalPair {
    /// Appends a round's record; a round too large for a file is an error, one that
    /// does not fit the rest of the active file says what to wait for.
    pub(crate) fn append(&mut self, round: u64, body: &[u8]) -> Result<Appended, StoreError> {
        match self.files[self.active].append(round, body) {
            Ok(()) => {
                self.last[self.active] = round;
                Ok(Appended::In(self.files[self.active].sync_handle()))
            }
            Err(JournalError::Full { .. }) => Ok(Appended::Full {
                wait_for: self.last[1 - self.active],
            }),
            Err(source) => Err(self.error(source)),
        }
    }

    /// Starts the other file over and makes it the active one: the engine must
    /// durably hold every round it has.
    pub(crate) fn switch(&mut self) -> Result<(), StoreError> {
        let other = 1 - self.active;
        self.files[other]
            .restart()
            .map_err(|source| self.error(source))?;
        self.last[other] = 0;
        self.active = other;
        Ok(())
    }

    /// The largest record body a file takes.
    pub(crate) fn capacity(&self) -> u64 {
        self.files[self.active].capacity()
    }

    fn error(&self, source: JournalError) -> StoreError {
        StoreError::Journal {
            path: self.folder.display().to_string(),
            source,
        }
    }
}

/// What opening the journal found and left.
pub(super) struct Opened {
    /// The journal to append to, `None` when the store runs without one.
    pub pair: Option<JournalPair>,
    /// The number the next round takes.
    pub next_round: u64,
}

/// Opens the journal in `folder` (made when `keep` and missing), writes to the engine
/// every round it holds that the engine does not, makes them durable in the engine,
/// then starts both files over. Without `keep`, a journal left by an earlier run is
/// replayed the same way and then removed.
pub(super) async fn open(
    engine: &Engine,
    folder: &Path,
    capacity: u64,
    keep: bool,
) -> Result<Opened, StoreError> {
    let held = match engine.get(ROUND_KEY).await? {
        Some(value) => <[u8; 8]>::try_from(&value[..])
            .map(u64::from_be_bytes)
            .map_err(|_| StoreError::Foreign)?,
        None => 0,
    };
    if !keep && !folder.exists() {
        return Ok(Opened {
            pair: None,
            next_round: held + 1,
        });
    }
    let error = |source| StoreError::Journal {
        path: folder.display().to_string(),
        source,
    };
    std::fs::create_dir_all(folder).map_err(|e| error(e.into()))?;
    let (a, in_a) = Journal::open(&folder.join(FILES[0]), capacity).map_err(error)?;
    let (b, in_b) = Journal::open(&folder.join(FILES[1]), capacity).map_err(error)?;
    let rounds = to_replay(held, in_a, in_b);
    let last = rounds.last().map_or(held, |r| r.round);
    if !rounds.is_empty() {
        let count = rounds.len();
        replay(engine, rounds).await?;
        tracing::info!(
            rounds = count,
            from = held + 1,
            to = last,
            "wrote the journal's rounds the engine did not hold"
        );
    }
    let resized = a.capacity() != capacity || b.capacity() != capacity;
    let mut pair = JournalPair {
        folder: folder.to_owned(),
        files: [a, b],
        last: [0, 0],
        active: 0,
    };
    if !keep || resized {
        // The engine holds everything the files had: they go (and, when
        // `store.journal_mb` changed, come back at the new size).
        drop(pair);
        std::fs::remove_dir_all(folder).map_err(|e| error(e.into()))?;
        if !keep {
            return Ok(Opened {
                pair: None,
                next_round: last + 1,
            });
        }
        std::fs::create_dir_all(folder).map_err(|e| error(e.into()))?;
        let (a, _) = Journal::open(&folder.join(FILES[0]), capacity).map_err(error)?;
        let (b, _) = Journal::open(&folder.join(FILES[1]), capacity).map_err(error)?;
        pair = JournalPair {
            folder: folder.to_owned(),
            files: [a, b],
            last: [0, 0],
            active: 0,
        };
    }
    // Both start over: the engine now holds everything they had. The active one
    // last, so the folder's newest generation is the one appended to.
    pair.switch()?;
    pair.switch()?;
    Ok(Opened {
        pair: Some(pair),
        next_round: last + 1,
    })
}

/// The rounds after `held`, in order, up to the first gap. Each round is in one file;
/// a gap can only follow the last round a crash tore, which nobody was told holds.
fn to_replay(held: u64, a: Vec<JournaledRound>, b: Vec<JournaledRound>) -> Vec<JournaledRound> {
    let mut rounds: Vec<JournaledRound> =
        a.into_iter().chain(b).filter(|r| r.round > held).collect();
    rounds.sort_by_key(|r| r.round);
    let mut expected = held + 1;
    let whole = rounds
        .iter()
        .take_while(|r| {
            let next = r.round == expected;
            expected += 1;
            next
        })
        .count();
    if whole < rounds.len() {
        tracing::warn!(
            after = held + whole as u64,
            left = rounds.len() - whole,
            "the journal's rounds skip a number; the ones after the gap are not written again"
        );
    }
    rounds.truncate(whole);
    rounds
}

/// Writes the rounds to the engine in order and waits until it holds them durably.
async fn replay(engine: &Engine, rounds: Vec<JournaledRound>) -> Result<(), StoreError> {
    for record in rounds {
        let writes = Writes::decode(Bytes::from(record.body)).map_err(|e| StoreError::Journal {
            path: "replay".to_owned(),
            source: JournalError::BadRecord {
                round: record.round,
                reason: e.to_string(),
            },
        })?;
        let mut batch = writes.into_batch();
        batch.put(ROUND_KEY, record.round.to_be_bytes());
        super::write_durably(engine, batch).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(round: u64) -> JournaledRound {
        JournaledRound {
            round,
            body: Vec::new(),
        }
    }

    #[test]
    fn rounds_past_the_engine_replay_in_order_across_both_files_up_to_a_gap() {
        let numbers =
            |rounds: Vec<JournaledRound>| rounds.iter().map(|r| r.round).collect::<Vec<_>>();
        // `b` started over after `a`'s rounds; the engine holds up to 4.
        let a = vec![round(3), round(4), round(5)];
        let b = vec![round(6), round(7)];
        assert_eq!(numbers(to_replay(4, a, b)), vec![5, 6, 7]);
        // A gap: what follows it is not replayed.
        let a = vec![round(1), round(2), round(4)];
        assert_eq!(numbers(to_replay(0, a, Vec::new())), vec![1, 2]);
        // Nothing past the engine.
        assert!(to_replay(9, vec![round(8), round(9)], Vec::new()).is_empty());
    }
}
