//! The journal file: the store's own write-ahead log on a local disk (issue 29),
//! one preallocated, zero-filled file that rounds are appended to and made durable by
//! one `fdatasync` per group commit, then replayed at start from the last round the
//! engine holds. Writing into blocks that already exist costs the disk one data sync
//! (no metadata, no new file, no directory sync): on this machine 123 µs p50 against
//! 396 µs for the new-file flush an engine WAL makes (BENCHMARKS.md, "What one durable
//! append costs this disk").
//!
//! Layout: a 16-byte header (magic, generation), then records, each
//! `[length u32][crc32 u32][generation u64][round u64][body]`, the CRC over generation,
//! round and body, little-endian. The file is zero-filled when made, so the records end
//! where a length is 0; a torn last record fails its CRC. Starting the file over
//! ([`Journal::restart`]) bumps the generation in the header, so records of the earlier
//! generation left behind the new ones are never read as new.
//!
//! This is the file layer only: what a record's body holds (a round's writes) and when
//! the engine holds a round (so the journal may start over) are the sequencer's.
//! Must never: return a record whose CRC fails, or one written after a torn one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"CNPYJRN1";
const HEADER: u64 = 16;
/// Length, CRC, generation and round.
const RECORD_HEAD: u64 = 4 + 4 + 8 + 8;
/// Zeros written per call while a new file is filled.
const FILL_CHUNK: usize = 1024 * 1024;

/// Why a round could not be journaled.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the journal is full ({capacity} bytes): the engine must hold what it has first")]
    Full { capacity: u64 },
    #[error("a journal record may hold at most {max} bytes, not {len}")]
    TooLarge { len: usize, max: u64 },
    #[error("{0} is not a journal (its header is not Canopy's)")]
    NotAJournal(String),
    #[error("a journal record cannot be empty")]
    Empty,
    #[error("the record of round {round} passed its checksum but does not decode: {reason}")]
    BadRecord { round: u64, reason: String },
    #[error("journal I/O: {0}")]
    Io(#[from] io::Error),
}

/// One round as it was journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournaledRound {
    pub round: u64,
    pub body: Vec<u8>,
}

/// An open journal file, appended to by one writer.
#[derive(Debug)]
pub struct Journal {
    /// Shared with whoever syncs it while this one appends.
    file: Arc<File>,
    capacity: u64,
    generation: u64,
    /// Where the next record goes.
    end: u64,
}

impl Journal {
    /// Opens the journal at `path`, making it (`capacity` bytes, zero-filled and
    /// synced, with its folder) when it does not exist; returns it with the rounds it
    /// holds, oldest first.
    pub fn open(
        path: &Path,
        capacity: u64,
    ) -> Result<(Journal, Vec<JournaledRound>), JournalError> {
        if !path.exists() {
            make(path, capacity)?;
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let capacity = file.metadata()?.len();
        let mut header = [0u8; HEADER as usize];
        file.read_exact_at(&mut header, 0)?;
        if &header[..8] != MAGIC {
            return Err(JournalError::NotAJournal(path.display().to_string()));
        }
        let generation = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let mut journal = Journal {
            file: Arc::new(file),
            capacity,
            generation,
            end: HEADER,
        };
        let rounds = journal.scan()?;
        Ok((journal, rounds))
    }

    /// Reads the records of this generation from the start, leaving `end` after the
    /// last whole one.
    fn scan(&mut self) -> Result<Vec<JournaledRound>, JournalError> {
        let mut rounds = Vec::new();
        let mut at = HEADER;
        let mut head = [0u8; RECORD_HEAD as usize];
        while at + RECORD_HEAD <= self.capacity {
            self.file.read_exact_at(&mut head, at)?;
            let len = u64::from(u32::from_le_bytes(
                head[0..4].try_into().unwrap_or_default(),
            ));
            let crc = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
            let generation = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            let round = u64::from_le_bytes(head[16..24].try_into().unwrap_or_default());
            if len == 0 || generation != self.generation || at + RECORD_HEAD + len > self.capacity {
                break;
            }
            let mut body = vec![0u8; len as usize];
            self.file.read_exact_at(&mut body, at + RECORD_HEAD)?;
            if checksum(generation, round, &body) != crc {
                // Torn: the write of this record (and of anything after it) did not
                // finish before the crash, so none of it was acknowledged.
                break;
            }
            rounds.push(JournaledRound { round, body });
            at += RECORD_HEAD + len;
        }
        self.end = at;
        Ok(rounds)
    }

    /// Appends one round (not yet durable: see [`Journal::sync`]).
    pub fn append(&mut self, round: u64, body: &[u8]) -> Result<(), JournalError> {
        if body.is_empty() {
            // A length of 0 is where the records end.
            return Err(JournalError::Empty);
        }
        let max = self.capacity.saturating_sub(HEADER + RECORD_HEAD);
        let len = u32::try_from(body.len())
            .ok()
            .filter(|len| u64::from(*len) <= max)
            .ok_or(JournalError::TooLarge {
                len: body.len(),
                max,
            })?;
        let size = RECORD_HEAD + u64::from(len);
        if self.end + size > self.capacity {
            return Err(JournalError::Full {
                capacity: self.capacity,
            });
        }
        let mut record = Vec::with_capacity(size as usize);
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&checksum(self.generation, round, body).to_le_bytes());
        record.extend_from_slice(&self.generation.to_le_bytes());
        record.extend_from_slice(&round.to_le_bytes());
        record.extend_from_slice(body);
        self.file.write_all_at(&record, self.end)?;
        self.end += size;
        Ok(())
    }

    /// Makes every appended record durable: one data sync of the file, whose blocks
    /// exist already.
    pub fn sync(&self) -> Result<(), JournalError> {
        self.file.sync_data()?;
        Ok(())
    }

    /// Starts the file over, once the engine holds every round in it: the next
    /// generation, durable before anything is appended to it.
    pub fn restart(&mut self) -> Result<(), JournalError> {
        self.generation += 1;
        let mut header = [0u8; HEADER as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&self.generation.to_le_bytes());
        self.file.write_all_at(&header, 0)?;
        self.file.sync_data()?;
        self.end = HEADER;
        Ok(())
    }

    /// The file, for syncing from another thread while appends go on: a sync covers
    /// every append that returned before it started.
    pub fn sync_handle(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }

    /// Bytes used, header included.
    pub fn used(&self) -> u64 {
        self.end
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// Makes a zero-filled journal file of `capacity` bytes under a temporary name,
/// synced, then renamed into place and its folder synced: a crash leaves either no
/// journal or a whole one.
fn make(path: &Path, capacity: u64) -> Result<(), JournalError> {
    let capacity = capacity.max(HEADER + RECORD_HEAD + 1);
    let temporary = path.with_extension("making");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)?;
    let zeros = vec![0u8; FILL_CHUNK];
    let mut at = 0;
    while at < capacity {
        let n = (capacity - at).min(FILL_CHUNK as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    let mut header = [0u8; HEADER as usize];
    header[..8].copy_from_slice(MAGIC);
    file.write_all_at(&header, 0)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    if let Some(folder) = path.parent() {
        File::open(folder)?.sync_all()?;
    }
    Ok(())
}

fn checksum(generation: u64, round: u64, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&generation.to_le_bytes());
    hasher.update(&round.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("canopy-journal-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("temp folder");
        dir
    }

    #[test]
    fn rounds_appended_and_synced_come_back_in_order_after_reopening() {
        let dir = folder();
        let path = dir.join("journal");
        let (mut journal, rounds) = Journal::open(&path, 64 * 1024).expect("open");
        assert!(rounds.is_empty());
        assert_eq!(journal.capacity(), 64 * 1024);
        for round in 1..=3u64 {
            journal
                .append(round, format!("round {round}").as_bytes())
                .expect("append");
        }
        journal.sync().expect("sync");
        drop(journal);
        let (journal, rounds) = Journal::open(&path, 64 * 1024).expect("reopen");
        let seen: Vec<(u64, String)> = rounds
            .into_iter()
            .map(|r| (r.round, String::from_utf8(r.body).expect("utf8")))
            .collect();
        assert_eq!(
            seen,
            vec![
                (1, "round 1".to_owned()),
                (2, "round 2".to_owned()),
                (3, "round 3".to_owned())
            ]
        );
        assert_eq!(journal.used(), HEADER + 3 * (RECORD_HEAD + 7));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_torn_record_ends_the_journal_and_the_next_append_overwrites_it() {
        let dir = folder();
        let path = dir.join("journal");
        let (mut journal, _) = Journal::open(&path, 64 * 1024).expect("open");
        journal.append(1, b"whole").expect("append");
        journal.append(2, b"torn record").expect("append");
        journal.sync().expect("sync");
        let torn_at = HEADER + RECORD_HEAD + 5 + RECORD_HEAD + 3;
        journal.file.write_all_at(b"XX", torn_at).expect("tear");
        drop(journal);
        let (mut journal, rounds) = Journal::open(&path, 64 * 1024).expect("reopen");
        assert_eq!(rounds.len(), 1, "only the whole record: {rounds:?}");
        journal.append(3, b"after").expect("append");
        journal.sync().expect("sync");
        drop(journal);
        let (_, rounds) = Journal::open(&path, 64 * 1024).expect("reopen");
        let numbers: Vec<u64> = rounds.iter().map(|r| r.round).collect();
        assert_eq!(numbers, vec![1, 3]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_restarted_journal_never_shows_the_rounds_of_its_earlier_generation() {
        let dir = folder();
        let path = dir.join("journal");
        let (mut journal, _) = Journal::open(&path, 64 * 1024).expect("open");
        for round in 1..=5u64 {
            journal
                .append(round, b"an older, longer round")
                .expect("append");
        }
        journal.sync().expect("sync");
        journal.restart().expect("restart");
        journal.append(6, b"new").expect("append");
        journal.sync().expect("sync");
        drop(journal);
        let (_, rounds) = Journal::open(&path, 64 * 1024).expect("reopen");
        let numbers: Vec<u64> = rounds.iter().map(|r| r.round).collect();
        assert_eq!(numbers, vec![6]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_full_journal_refuses_and_a_foreign_file_is_not_opened() {
        let dir = folder();
        let path = dir.join("journal");
        let (mut journal, _) = Journal::open(&path, 256).expect("open");
        assert!(matches!(
            journal.append(1, &[0u8; 300]),
            Err(JournalError::TooLarge { .. })
        ));
        journal.append(1, &[1u8; 100]).expect("fits");
        assert!(matches!(
            journal.append(2, &[2u8; 100]),
            Err(JournalError::Full { capacity: 256 })
        ));
        let foreign = dir.join("foreign");
        std::fs::write(&foreign, vec![7u8; 1024]).expect("write");
        assert!(matches!(
            Journal::open(&foreign, 1024),
            Err(JournalError::NotAJournal(_))
        ));
        std::fs::remove_dir_all(dir).ok();
    }
}
