//! The intent log (issue 15): every change answered before its commit (an early create,
//! remove, attribute change or new small file's bytes, see `dirops`) is copied into a file of
//! the session's on local disk (mapped, see `IntentLog`) before it is answered, and the committer records in the same
//! transaction as each batch the number of the newest logged change the batch holds
//! (`intent_logs.applied`). A daemon killed with changes answered and not committed leaves
//! them in its log; the next mount of the volume on this machine applies the ones past the
//! watermark, in order, before it serves anything (`SqlStore::replay_intent_logs`).
//!
//! - *The watermark.* A logged change takes its number from an atomic counter (no lock: the
//!   changes of every queue pass here) and then enters the committer's queue, so a number
//!   may enter the queue after a larger one. The committer keeps which numbers are finished
//!   (`Watermark`: all up to `applied`, and the few in `above` that overtook a smaller one)
//!   and writes it with each batch. A replay applies the records it does not cover, in
//!   number order: the kernel sends a change that depends on another only after the other
//!   was answered, so its number is larger; changes whose order the numbers do not give
//!   were in flight together, and neither depends on the other.
//! - *Finished* is committed, or failed at its commit: an answered change whose commit
//!   failed was reported (fsync and close, `async_dirop_errors`) and is not tried again,
//!   as during the mount. A log whose last changes could not commit at all (the database
//!   gone until the unmount) is kept for the next mount.
//! - *What a record survives.* It is in the file's page cache (not synced) before the answer:
//!   a kill -9 of the daemon leaves it there, so nothing answered is lost. A machine crash
//!   loses what the OS had not written, which is never what fsync acknowledged (fsync waits
//!   for the commit, as before).
//! - *Which log is whose.* `<dir>/<session>.log`, held with flock for the session's life.
//!   A mount takes every other log of the directory it can lock (its writer is dead; two
//!   mounts of one volume on one machine keep apart so), replays it, removes the file and
//!   then the row. A record is applied with the watermark's advance in one transaction, so a
//!   replay cut short by another crash goes on where it stopped.
//! - *Conflicts.* A record is applied by the same code and checks as the synchronous change
//!   (`ops`): one that no longer fits (on a shared volume another mount took the name after
//!   this one's lease expired, a directory is gone) is logged with its name and cause and
//!   dropped; the others are still applied.
//! - *Size.* The mapped file has a fixed size (`LOG_BYTES`); it is emptied (records go to its
//!   start again) when past half full and every change numbered so far is finished. A record
//!   that finds it full waits for that (it comes once the queued changes commit), at most
//!   `FULL_WAIT_MAX`; then (the database busy or gone) it is written past the mapping with
//!   `pwrite(2)`, and the next emptying cuts the file back.
//! - *How far ahead.* With `async_backlog` changes numbered and not finished, the next
//!   waits for room (`wait_for_backlog_below`); with none within a second, a full log or the
//!   database gone, the mount answers changes after their commit again
//!   (`SqlStore::backlog_has_room`) until the database catches up: what waits for a
//!   database that is slow or gone is bounded, in memory and here.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use std::hash::Hasher;

use siphasher::sip::SipHasher24;

use crate::blocks::checksum;
use crate::meta::{AttrChange, InlineUpdate, NewNode};

/// The first bytes of a log file, with its format's version; then the log's key
/// (`KEY_BYTES`, at `KEY_AT`).
const HEADER: &[u8; 8] = b"lanefsI3";
/// The header of the logs of lanefs before 2026-11-29, whose records carry a crc32 and no
/// key (`LegacyTag`): a crash of such a mount is still replayed after an upgrade.
const HEADER_V2: &[u8; 8] = b"lanefsI2";
/// A log's key: 128 random bits, made with the log, that key its records' tags. Records
/// hold bytes a user chose (a small file's contents, names), and the log is read back by
/// stepping over damage to every 8-aligned place: with a checksum anyone can compute, a
/// user's file could carry whole records that a replay, run by the daemon, would apply
/// once an emptying wrote over the head of the record holding them. Only a record sealed
/// with this log's key, which only the log's owner can read, is applied.
const KEY_AT: usize = 8;
const KEY_BYTES: usize = 16;
/// Where records start (past the header, aligned).
const RECORDS_START: u64 = 64;
/// Each record, 8-byte aligned: a marker, the body's length (u32), the body's tag (u64:
/// SipHash-2-4 under the log's key), then the body: number (u64), kind (u8), payload; zeros
/// to the next 8.
const RECORD_MARK: &[u8; 4] = b"LIR3";
/// A record of a `HEADER_V2` log: the same, with the body's crc32 (u32) and 4 zero bytes in
/// the tag's place.
const RECORD_MARK_V2: &[u8; 4] = b"LIR2";
const RECORD_HEAD: usize = 16;
/// A record longer than this is damage, not a change (the largest is a new file's inline
/// bytes, at most 64 KiB, or a create's inherited ACLs).
const RECORD_BYTES_MAX: usize = 4 << 20;
/// The log file's size, allocated when it is made. It is emptied when past half full and
/// every change in it is finished; a record that finds it full goes past it (see `append`).
const LOG_BYTES: u64 = 16 << 20;
/// How long a record that finds the log full waits for an emptying before it is written
/// past the mapping instead: a few batches' commits.
const FULL_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// A change answered before its commit, as the log keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    Create(NewNode),
    Remove {
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
    },
    Inline(InlineUpdate),
    Setattr {
        ino: u64,
        change: AttrChange,
    },
}

impl Intent {
    /// What the change is, for log lines: "create 'a' in directory 5".
    pub fn describe(&self) -> String {
        let shown = |name: &[u8]| String::from_utf8_lossy(name).into_owned();
        match self {
            Intent::Create(n) => {
                format!(
                    "create of '{}' (inode {}) in directory {}",
                    shown(&n.name),
                    n.ino.unwrap_or(0),
                    n.parent
                )
            }
            Intent::Remove { parent, name, .. } => {
                format!("removal of '{}' from directory {parent}", shown(name))
            }
            Intent::Inline(u) => format!("the bytes of new file {} ({} bytes)", u.ino, u.size),
            Intent::Setattr { ino, .. } => format!("an attribute change of new inode {ino}"),
        }
    }

    /// The record, its number left 0 (`IntentLog::append` sets it).
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Intent::Create(n) => record_of_create(n),
            Intent::Remove {
                parent,
                name,
                dir,
                now_ns,
            } => record_of_remove(*parent, name, *dir, *now_ns),
            Intent::Inline(u) => record_of_inline(u),
            Intent::Setattr { ino, change } => record_of_setattr(*ino, change),
        }
    }

    /// A record's number and change from `body` (what follows the length and crc); None
    /// for anything malformed.
    fn decode(body: &[u8]) -> Option<(u64, Intent)> {
        let mut d = Dec { buf: body, pos: 0 };
        let seq = d.u64()?;
        let intent = match d.u8()? {
            1 => {
                let ino = d.u64()?;
                let parent = d.u64()?;
                let name = d.bytes()?;
                let (mode, uid, gid, rdev) = (d.u32()?, d.u32()?, d.u32()?, d.u32()?);
                let target = d.opt_bytes()?;
                let now_ns = d.i64()?;
                let n = d.u32()? as usize;
                let mut xattrs = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    xattrs.push((d.bytes()?, d.bytes()?));
                }
                Intent::Create(NewNode {
                    ino: (ino != 0).then_some(ino),
                    parent,
                    name,
                    mode,
                    uid,
                    gid,
                    rdev,
                    target,
                    now_ns,
                    lease_expires_ns: None,
                    unleased_at_ns: None,
                    xattrs,
                    inherit: None,
                })
            }
            2 => Intent::Remove {
                parent: d.u64()?,
                name: d.bytes()?,
                dir: d.u8()? != 0,
                now_ns: d.i64()?,
            },
            3 => Intent::Inline(InlineUpdate {
                ino: d.u64()?,
                size: d.u64()?,
                mtime_ns: d.i64()?,
                ctime_ns: d.i64()?,
                bytes: d.bytes()?,
            }),
            4 => Intent::Setattr {
                ino: d.u64()?,
                change: AttrChange {
                    mode: d.opt_u32()?,
                    uid: d.opt_u32()?,
                    gid: d.opt_u32()?,
                    atime_ns: d.opt_i64()?,
                    mtime_ns: d.opt_i64()?,
                    ctime_ns: d.i64()?,
                },
            },
            _ => return None,
        };
        (d.pos == body.len()).then_some((seq, intent))
    }
}

// A change's record, made from borrowed parts: the store encodes before it moves them
// into the change, so logging copies nothing but the record itself.

pub fn record_of_create(n: &NewNode) -> Vec<u8> {
    record(1, |e| {
        e.u64(n.ino.unwrap_or(0));
        e.u64(n.parent);
        e.bytes(&n.name);
        e.u32(n.mode);
        e.u32(n.uid);
        e.u32(n.gid);
        e.u32(n.rdev);
        e.opt_bytes(n.target.as_deref());
        e.i64(n.now_ns);
        e.u32(n.xattrs.len() as u32);
        for (name, value) in &n.xattrs {
            e.bytes(name);
            e.bytes(value);
        }
    })
}

pub fn record_of_remove(parent: u64, name: &[u8], dir: bool, now_ns: i64) -> Vec<u8> {
    record(2, |e| {
        e.u64(parent);
        e.bytes(name);
        e.u8(u8::from(dir));
        e.i64(now_ns);
    })
}

pub fn record_of_inline(u: &InlineUpdate) -> Vec<u8> {
    record(3, |e| {
        e.u64(u.ino);
        e.u64(u.size);
        e.i64(u.mtime_ns);
        e.i64(u.ctime_ns);
        e.bytes(&u.bytes);
    })
}

pub fn record_of_setattr(ino: u64, change: &AttrChange) -> Vec<u8> {
    record(4, |e| {
        e.u64(ino);
        e.opt_u32(change.mode);
        e.opt_u32(change.uid);
        e.opt_u32(change.gid);
        e.opt_i64(change.atime_ns);
        e.opt_i64(change.mtime_ns);
        e.i64(change.ctime_ns);
    })
}

/// A record of `kind` with the payload `fill` writes: head, number 0, kind, payload, padding.
fn record(kind: u8, fill: impl FnOnce(&mut Enc)) -> Vec<u8> {
    let mut e = Enc(vec![0; RECORD_HEAD + 8]);
    e.u8(kind);
    fill(&mut e);
    let mut record = e.0;
    let len = (record.len() - RECORD_HEAD) as u32;
    record[..4].copy_from_slice(RECORD_MARK);
    record[4..8].copy_from_slice(&len.to_le_bytes());
    record.resize(record.len().next_multiple_of(8), 0);
    record
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn opt_bytes(&mut self, v: Option<&[u8]>) {
        self.u8(u8::from(v.is_some()));
        if let Some(v) = v {
            self.bytes(v);
        }
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        self.u8(u8::from(v.is_some()));
        if let Some(v) = v {
            self.u32(v);
        }
    }
    fn opt_i64(&mut self, v: Option<i64>) {
        self.u8(u8::from(v.is_some()));
        if let Some(v) = v {
            self.i64(v);
        }
    }
}

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
    fn opt_bytes(&mut self) -> Option<Option<Vec<u8>>> {
        Some(match self.u8()? {
            0 => None,
            _ => Some(self.bytes()?),
        })
    }
    fn opt_u32(&mut self) -> Option<Option<u32>> {
        Some(match self.u8()? {
            0 => None,
            _ => Some(self.u32()?),
        })
    }
    fn opt_i64(&mut self) -> Option<Option<i64>> {
        Some(match self.u8()? {
            0 => None,
            _ => Some(self.i64()?),
        })
    }
}

/// Which logged changes are finished: every number up to `applied`, and `above`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Watermark {
    pub applied: u64,
    pub above: BTreeSet<u64>,
}

impl Watermark {
    /// From its row (`above`: numbers separated by commas).
    pub fn parse(applied: u64, above: &str) -> Watermark {
        Watermark {
            applied,
            above: above.split(',').filter_map(|n| n.parse().ok()).collect(),
        }
    }

    /// `above` as its row keeps it.
    pub fn above_text(&self) -> String {
        let numbers: Vec<String> = self.above.iter().map(u64::to_string).collect();
        numbers.join(",")
    }

    pub fn covers(&self, seq: u64) -> bool {
        seq <= self.applied || self.above.contains(&seq)
    }

    /// This one with `seqs` finished too.
    pub fn with(&self, seqs: impl IntoIterator<Item = u64>) -> Watermark {
        let mut next = self.clone();
        next.above
            .extend(seqs.into_iter().filter(|&s| s > self.applied));
        while next.above.remove(&(next.applied + 1)) {
            next.applied += 1;
        }
        next
    }
}

/// This session's log: a file of `LOG_BYTES`, allocated up front and mapped, into which a
/// record is copied at a place reserved with one atomic add: no system call and no lock per
/// change (a `write(2)` per change took the inode lock of one shared file from every queue
/// and cost 8 % of a kernel untar). A shared mapping's pages are the file's page cache, so
/// a kill -9 of the daemon loses none of them. Allocated up front because a store into a
/// hole the disk cannot fill would be SIGBUS: a full disk makes the mount answer after
/// commits instead.
pub struct IntentLog {
    path: PathBuf,
    /// Held with flock (LOCK_EX) until the process ends; the mapping's file.
    file: File,
    /// The mapping: `LOG_BYTES` bytes, shared, readable and writable.
    map: *mut u8,
    /// The key of its records' tags (`KEY_AT`).
    key: [u8; KEY_BYTES],
    /// The next record's number.
    next: AtomicU64,
    /// Where the next record goes (past the mapping's end: written there by `pwrite(2)`).
    tail: AtomicU64,
    /// Writers between their check of `empties` and the end of their copy.
    copying: AtomicU64,
    /// Emptyings, twice each: odd while one is under way (no reservation starts then).
    empties: AtomicU64,
    /// A record could not be written past the mapping: said once until one is again.
    failing: std::sync::atomic::AtomicBool,
    /// How many numbered changes are finished (committed or failed), as the committer last
    /// told (`note_finished`): `last() - finished` wait for the database.
    finished: AtomicU64,
    /// Changes waiting for room in the backlog (`wait_for_backlog_below`) wait on the
    /// condvar, under the mutex (which guards nothing else: a leaf lock), for the
    /// committer's `note_finished`.
    finishing: (Mutex<()>, Condvar),
}

// SAFETY: the mapping is plain memory shared with the kernel's page cache; threads write it
// only at disjoint ranges each reserved with an atomic add on `tail`, and an emptying moves
// `tail` back only when no writer is copying (`copying`, `empties`), so no two threads ever
// write the same byte at once; it is unmapped only in `drop`, when no other reference exists.
unsafe impl Send for IntentLog {}
// SAFETY: see `Send`: every shared access goes through the atomics above.
unsafe impl Sync for IntentLog {}

impl IntentLog {
    /// Makes `dir` if needed and this session's log in it: locked, allocated, mapped.
    pub fn create(dir: &Path, session: u64) -> Result<IntentLog, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("the intent log's directory {}: {e}", dir.display()))?;
        check_private(dir)?;
        let path = dir.join(format!("{session}.log"));
        let shown = path.display();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{shown}: {e}"))?;
        if !try_lock(&file) {
            return Err(format!("{shown}: held by another process"));
        }
        let mut key = [0u8; KEY_BYTES];
        let made = (|| {
            File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut key))
                .map_err(|e| format!("{shown}: reading /dev/urandom for its key: {e}"))?;
            // The header first, and on disk before any record: a log that a crash left
            // without one (its key lost) cannot be read, and it fails every later mount's
            // replay with "not a lanefs intent log" until removed by hand.
            let mut header = [0u8; RECORDS_START as usize];
            header[..HEADER.len()].copy_from_slice(HEADER);
            header[KEY_AT..KEY_AT + KEY_BYTES].copy_from_slice(&key);
            (&file)
                .write_all(&header)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("{shown}: {e}"))?;
            // SAFETY: posix_fallocate on an fd we own; no memory is involved.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, LOG_BYTES as i64) };
            if rc != 0 {
                return Err(format!(
                    "{shown}: allocating {} MiB: {}",
                    LOG_BYTES >> 20,
                    std::io::Error::from_raw_os_error(rc)
                ));
            }
            // SAFETY: a new shared mapping of the whole file, which is LOG_BYTES long (just
            // allocated) and stays open (and so mappable) for the log's life; munmap in drop.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    LOG_BYTES as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if map == libc::MAP_FAILED {
                return Err(format!(
                    "{shown}: mapping it: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(map as *mut u8)
        })();
        let map = match made {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(IntentLog {
            path,
            file,
            map,
            key,
            next: AtomicU64::new(1),
            tail: AtomicU64::new(RECORDS_START),
            copying: AtomicU64::new(0),
            empties: AtomicU64::new(0),
            failing: std::sync::atomic::AtomicBool::new(false),
            finished: AtomicU64::new(0),
            finishing: (Mutex::new(()), Condvar::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Numbers `record`, runs `enqueue` with the number (it puts the change on the
    /// committer's queue), then copies the record into the log.
    pub fn append(&self, mut record: Vec<u8>, enqueue: impl FnOnce(u64)) {
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        enqueue(seq);
        seal(&mut record, seq, &self.key);
        let len = record.len() as u64;
        loop {
            self.copying.fetch_add(1, Ordering::SeqCst);
            if !self.empties.load(Ordering::SeqCst).is_multiple_of(2) {
                // An emptying is under way: it waits for the writers already copying, and
                // this one reserves after it.
                self.copying.fetch_sub(1, Ordering::SeqCst);
                self.wait_for_emptying();
                continue;
            }
            let at = self.tail.fetch_add(len, Ordering::SeqCst);
            if at + len > LOG_BYTES {
                // Full. Every change in it is queued, so an emptying comes once they
                // commit (a batch's time): wait that long, not longer. A busy or absent
                // database must not hang a queue's worker: past `FULL_WAIT_MAX` the record
                // is written past the mapping, to the file, which the next emptying cuts
                // back.
                self.copying.fetch_sub(1, Ordering::SeqCst);
                let seen = self.empties.load(Ordering::SeqCst);
                let until = std::time::Instant::now() + FULL_WAIT_MAX;
                while self.empties.load(Ordering::SeqCst) == seen
                    && std::time::Instant::now() < until
                {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                if self.empties.load(Ordering::SeqCst) != seen {
                    continue;
                }
                self.copying.fetch_add(1, Ordering::SeqCst);
                if !self.empties.load(Ordering::SeqCst).is_multiple_of(2)
                    || self.empties.load(Ordering::SeqCst) != seen
                {
                    // An emptying began meanwhile: `at` may be handed out again.
                    self.copying.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                self.write_past_mapping(&record, at);
                self.copying.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            // SAFETY: [at, at + len) lies inside the mapping (checked above) and was
            // reserved for this writer alone by the add on `tail`; no emptying can hand it
            // out again before `copying` drops (see `committed`).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    record.as_ptr(),
                    self.map.add(at as usize),
                    record.len(),
                )
            };
            self.copying.fetch_sub(1, Ordering::SeqCst);
            return;
        }
    }

    /// A record at `at`, past the mapping, by `pwrite(2)`. A failure (the disk full) loses
    /// only the protection from a crash: the change commits as any other.
    fn write_past_mapping(&self, record: &[u8], at: u64) {
        use std::os::unix::fs::FileExt;
        match self.file.write_all_at(record, at) {
            Ok(()) => self.failing.store(false, Ordering::Relaxed),
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "volume: cannot write the intent log {}: {e}; changes answered before their commit are lost if the daemon dies before it",
                        self.path.display()
                    );
                }
            }
        }
    }

    fn wait_for_emptying(&self) {
        while !self.empties.load(Ordering::SeqCst).is_multiple_of(2) {
            std::thread::yield_now();
        }
    }

    /// `finished` was committed: empties the log when it is past half full and every number
    /// handed out so far is finished; whether it did. Only the committer calls it (one
    /// emptying at a time).
    pub fn committed(&self, finished: &Watermark) -> bool {
        if self.tail.load(Ordering::SeqCst) < LOG_BYTES / 2 || !finished.above.is_empty() {
            return false;
        }
        // Odd first, then wait out the writers already copying: a writer that checked
        // before this saw even and is counted in `copying`; one that checks after sees odd.
        // Its number was taken before its check, so `last` below includes every record
        // that can still be copied before the emptying.
        self.empties.fetch_add(1, Ordering::SeqCst);
        while self.copying.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        let empty = self.last() == finished.applied;
        if empty {
            // The old records stay in place until overwritten; each is finished, so a
            // replay skips it. What grew past the mapping goes.
            if self.tail.load(Ordering::SeqCst) > LOG_BYTES
                && let Err(e) = self.file.set_len(LOG_BYTES)
            {
                tracing::warn!(
                    "volume: cutting back the intent log {}: {e}",
                    self.path.display()
                );
            }
            self.tail.store(RECORDS_START, Ordering::SeqCst);
        }
        self.empties.fetch_add(1, Ordering::SeqCst);
        empty
    }

    /// The committer's word after each batch, committed or not: `finished` is what is over.
    pub fn note_finished(&self, finished: &Watermark) {
        let count = finished.applied + finished.above.len() as u64;
        self.finished.store(count, Ordering::Relaxed);
        // Taken so that a waiter between its look at the backlog and its wait cannot miss
        // this.
        let _finishing = self.finishing.0.lock().unwrap_or_else(|e| e.into_inner());
        self.finishing.1.notify_all();
    }

    /// Waits until fewer than `max` changes wait for the database, at most `within`;
    /// whether they do.
    pub fn wait_for_backlog_below(&self, max: u64, within: Duration) -> bool {
        let finishing = self.finishing.0.lock().unwrap_or_else(|e| e.into_inner());
        let (_finishing, waited) = self
            .finishing
            .1
            .wait_timeout_while(finishing, within, |_| self.backlog() >= max)
            .unwrap_or_else(|e| e.into_inner());
        !waited.timed_out()
    }

    /// Changes numbered and not finished yet: answered, waiting for the database.
    pub fn backlog(&self) -> u64 {
        self.last()
            .saturating_sub(self.finished.load(Ordering::Relaxed))
    }

    /// Whether the mapping is used up: records go past it until the next emptying.
    pub fn full(&self) -> bool {
        self.tail.load(Ordering::Relaxed) >= LOG_BYTES
    }

    /// The newest number handed out (0: none).
    pub fn last(&self) -> u64 {
        self.next.load(Ordering::SeqCst) - 1
    }

    /// A clean end: removes the file (the caller then drops the row).
    pub fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}

impl Drop for IntentLog {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, of that length; nothing refers to it once
        // the log is dropped.
        unsafe { libc::munmap(self.map as *mut libc::c_void, LOG_BYTES as usize) };
    }
}

/// Sets a record's number, then its tag under `key`.
fn seal(record: &mut [u8], seq: u64, key: &[u8; KEY_BYTES]) {
    record[RECORD_HEAD..RECORD_HEAD + 8].copy_from_slice(&seq.to_le_bytes());
    let body_len = u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
    let tag = tag(key, &record[RECORD_HEAD..RECORD_HEAD + body_len]);
    record[8..16].copy_from_slice(&tag.to_le_bytes());
}

/// A record body's tag: SipHash-2-4, a keyed function made for short messages, under the
/// log's key (see `KEY_AT`), of the body's crc32 and length. Of those rather than of the
/// body: crc32 runs at memory speed and SipHash at a byte per cycle or two, and a new small
/// file's bytes (up to 64 KiB) are in their record; a forger who made a body with the crc of
/// another would still need that other record's tag, which only the log's owner can read.
fn tag(key: &[u8; KEY_BYTES], body: &[u8]) -> u64 {
    let mut hasher = SipHasher24::new_with_key(key);
    hasher.write(&checksum(body).to_le_bytes());
    hasher.write(&(body.len() as u64).to_le_bytes());
    hasher.finish()
}

/// How a log's records are told whole: which marker they start with, and their tag.
enum Tags {
    Keyed([u8; KEY_BYTES]),
    /// A `HEADER_V2` log's crc32.
    LegacyCrc,
}

impl Tags {
    fn mark(&self) -> &'static [u8; 4] {
        match self {
            Tags::Keyed(_) => RECORD_MARK,
            Tags::LegacyCrc => RECORD_MARK_V2,
        }
    }

    fn whole(&self, head: &[u8], body: &[u8]) -> bool {
        match self {
            Tags::Keyed(key) => {
                u64::from_le_bytes(head[8..16].try_into().unwrap()) == tag(key, body)
            }
            Tags::LegacyCrc => {
                u32::from_le_bytes(head[8..12].try_into().unwrap()) == checksum(body)
            }
        }
    }
}

/// `dir` is a directory (not a link to one) of this process's user that no one else may
/// write to.
fn check_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} must be a directory of uid {me} that only it may write to (it is owned by uid {}, mode {:o}); its intent logs are not used",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// A log to replay is a regular file of this process's user that no one else may write to.
fn check_private_file(file: &File, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a regular file of uid {me} that only it may write to: not applied",
            path.display()
        ));
    }
    Ok(())
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on an fd we own; no memory is involved.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// A dead session's log, locked for its replay.
pub struct DeadLog {
    pub session: u64,
    pub path: PathBuf,
    /// Keeps the lock until the replay is done.
    _file: File,
    /// Its records in number order (a torn or damaged tail ends the list).
    pub records: Vec<(u64, Intent)>,
    /// Bytes that were neither free nor part of a whole record: a copy the kill cut short,
    /// or what is left of records already finished where an emptying wrote over them.
    pub skipped_bytes: usize,
}

/// The logs in `dir` other than `own` whose writers are dead (their flock can be taken).
pub fn dead_logs(dir: &Path, own: Option<u64>) -> Result<Vec<DeadLog>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("the intent log's directory {}: {e}", dir.display())),
    };
    // A replay creates files and sets their modes and owners as the records say: records
    // someone else could have written are never applied.
    check_private(dir)?;
    let mut logs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name();
        let Some(session) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if Some(session) == own {
            continue;
        }
        let path = entry.path();
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        check_private_file(&file, &path)?;
        if !try_lock(&file) {
            continue; // its mount is alive
        }
        let mut content = Vec::new();
        file.read_to_end(&mut content)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (records, skipped_bytes) = parse(&content)
            .ok_or_else(|| format!("{} is not a lanefs intent log", path.display()))?;
        logs.push(DeadLog {
            session,
            path,
            _file: file,
            records,
            skipped_bytes,
        });
    }
    logs.sort_by_key(|l| l.session);
    Ok(logs)
}

/// A log's whole records in number order and the bytes after them; None without the header
/// (an empty file, made and never written, counts as empty, and so does one whose header is
/// zeros: made by a lanefs before 2026-11-29 and cut short by a crash before its header was
/// written back, it holds no record a key could vouch for).
fn parse(content: &[u8]) -> Option<(Vec<(u64, Intent)>, usize)> {
    if content[..content.len().min(HEADER.len())]
        .iter()
        .all(|b| *b == 0)
    {
        return Some((Vec::new(), 0));
    }
    let tags = if content.starts_with(HEADER.as_slice()) && content.len() >= RECORDS_START as usize
    {
        Tags::Keyed(content[KEY_AT..KEY_AT + KEY_BYTES].try_into().unwrap())
    } else if content.starts_with(HEADER_V2.as_slice()) {
        Tags::LegacyCrc
    } else {
        return None;
    };
    // Records may sit anywhere 8-aligned (an emptying reuses the space, a kill may cut a
    // copy): every aligned place is tried; what is not a whole record is stepped over.
    let mut records = Vec::new();
    let mut skipped = 0;
    let mut at = RECORDS_START as usize;
    while at + RECORD_HEAD <= content.len() {
        match record_at(&content[at..], &tags) {
            Some((record, len)) => {
                records.push(record);
                at += len;
            }
            None => {
                if content[at..at + 8] != [0; 8] {
                    skipped += 8;
                }
                at += 8;
            }
        }
    }
    records.sort_by_key(|(seq, _)| *seq);
    records.dedup_by_key(|(seq, _)| *seq);
    Some((records, skipped))
}

/// The whole record at the start of `rest` and its length with padding, if there is one.
fn record_at(rest: &[u8], tags: &Tags) -> Option<((u64, Intent), usize)> {
    if &rest[..4] != tags.mark() {
        return None;
    }
    let len = u32::from_le_bytes(rest[4..8].try_into().ok()?) as usize;
    if len > RECORD_BYTES_MAX || rest.len() < RECORD_HEAD + len {
        return None;
    }
    let body = &rest[RECORD_HEAD..RECORD_HEAD + len];
    if !tags.whole(&rest[..RECORD_HEAD], body) {
        return None;
    }
    let record = Intent::decode(body)?;
    Some((record, (RECORD_HEAD + len).next_multiple_of(8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("lanefs-intent-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            TempDir(dir)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn samples() -> Vec<Intent> {
        vec![
            Intent::Create(NewNode {
                ino: Some(77),
                parent: 1,
                name: b"a file".to_vec(),
                mode: libc::S_IFREG | 0o644,
                uid: 1000,
                gid: 100,
                rdev: 0,
                target: None,
                now_ns: 123,
                lease_expires_ns: None,
                unleased_at_ns: None,
                xattrs: vec![(b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0])],
                inherit: None,
            }),
            Intent::Create(NewNode {
                ino: Some(78),
                parent: 77,
                name: b"l".to_vec(),
                mode: libc::S_IFLNK | 0o777,
                target: Some(b"/elsewhere".to_vec()),
                ..NewNode::default()
            }),
            Intent::Remove {
                parent: 1,
                name: b"gone".to_vec(),
                dir: true,
                now_ns: -5,
            },
            Intent::Inline(InlineUpdate {
                ino: 77,
                size: 3,
                mtime_ns: 9,
                ctime_ns: 10,
                bytes: b"abc".to_vec(),
            }),
            Intent::Setattr {
                ino: 77,
                change: AttrChange {
                    mode: Some(0o600),
                    uid: None,
                    gid: Some(5),
                    atime_ns: None,
                    mtime_ns: Some(1),
                    ctime_ns: 2,
                },
            },
        ]
    }

    /// A new file's 60,000 inline bytes: a few hundred fill the log.
    fn big_record() -> Intent {
        Intent::Inline(InlineUpdate {
            ino: 5,
            size: 60_000,
            mtime_ns: 0,
            ctime_ns: 0,
            bytes: vec![7; 60_000],
        })
    }

    #[test]
    fn records_come_back_in_number_order_and_a_damaged_one_is_stepped_over() {
        let dir = TempDir::new("order");
        let log = IntentLog::create(dir.path(), 3).unwrap();
        let mut queued = Vec::new();
        for intent in samples() {
            log.append(intent.encode(), |seq| queued.push(seq));
        }
        assert_eq!(queued, vec![1, 2, 3, 4, 5]);
        assert_eq!(log.last(), 5);
        // A live log is not another mount's to replay.
        assert!(dead_logs(dir.path(), None).unwrap().is_empty());
        let mut content = std::fs::read(log.path()).unwrap();
        assert_eq!(content.len() as u64, LOG_BYTES, "allocated whole");
        drop(log);
        let (records, skipped) = parse(&content).unwrap();
        assert_eq!(skipped, 0);
        let expected: Vec<(u64, Intent)> = (1..).zip(samples()).collect();
        assert_eq!(records, expected);
        // A copy cut short in the second record: the others stand, after it too.
        let second = RECORDS_START as usize + samples()[0].encode().len();
        content[second + RECORD_HEAD + 3] ^= 0xff;
        let (records, skipped) = parse(&content).unwrap();
        let mut without_second = expected.clone();
        without_second.remove(1);
        assert_eq!(records, without_second);
        assert!(skipped > 0);
        assert!(parse(b"not a log").is_none());
    }

    /// Records a user wrote into a small file's bytes, which the log keeps verbatim: once
    /// the head of the record holding them is written over (an emptying reuses the space),
    /// reading steps over the damage onto them. Sealed with a checksum anyone can compute
    /// (the old format's crc32) or a key other than the log's, they are not applied; the
    /// same bytes sealed with the log's own key are (the control: the forgery was where a
    /// reader looks).
    #[test]
    fn records_forged_inside_a_files_bytes_are_not_applied() {
        let forged = Intent::Setattr {
            ino: 1,
            change: AttrChange {
                mode: Some(0o104755),
                uid: Some(0),
                gid: Some(0),
                atime_ns: None,
                mtime_ns: None,
                ctime_ns: 0,
            },
        };
        let with_crc = |seq: u64| sealed_with_crc(&forged, seq);
        let with_key = |seq: u64, key: &[u8; KEY_BYTES]| {
            let mut record = forged.encode();
            seal(&mut record, seq, key);
            record
        };
        // A file's bytes: the forgery at each of the 8 shifts, so one copy is 8-aligned in
        // the log wherever the file's bytes start.
        let file_bytes = |records: &[Vec<u8>]| {
            let mut bytes = Vec::new();
            for shift in 0..8 {
                for record in records {
                    bytes.extend(std::iter::repeat_n(0xee, shift));
                    bytes.extend_from_slice(record);
                    bytes.extend(std::iter::repeat_n(0xee, 8 - shift));
                }
            }
            bytes
        };
        let applied = |records: &[Vec<u8>], log_key: Option<&[u8; KEY_BYTES]>| {
            let dir = TempDir::new(&format!("forged-{}", log_key.is_some()));
            let log = IntentLog::create(dir.path(), 1).unwrap();
            let records = match log_key {
                // The control: sealed with the log's own key, read from its header.
                Some(_) => vec![with_key(1 << 50, &log.key)],
                None => records.to_vec(),
            };
            let bytes = file_bytes(&records);
            log.append(
                Intent::Inline(InlineUpdate {
                    ino: 5,
                    size: bytes.len() as u64,
                    mtime_ns: 0,
                    ctime_ns: 0,
                    bytes,
                })
                .encode(),
                |_| {},
            );
            let mut content = std::fs::read(log.path()).unwrap();
            drop(log);
            let start = RECORDS_START as usize;
            content[start..start + RECORD_HEAD].fill(0);
            let (records, _) = parse(&content).unwrap();
            records
                .iter()
                .filter(|(_, r)| matches!(r, Intent::Setattr { .. }))
                .count()
        };
        let foreign_key = [0x5a; KEY_BYTES];
        assert_eq!(
            applied(&[with_crc(1 << 50), with_key(1 << 51, &foreign_key)], None),
            0,
            "a forged record was read back"
        );
        assert!(
            applied(&[], Some(&foreign_key)) > 0,
            "the control found nothing"
        );
    }

    /// `intent` as a record of an old-format log (`RECORD_MARK_V2`, crc32) numbered `seq`.
    fn sealed_with_crc(intent: &Intent, seq: u64) -> Vec<u8> {
        let mut record = intent.encode();
        record[..4].copy_from_slice(RECORD_MARK_V2);
        record[RECORD_HEAD..RECORD_HEAD + 8].copy_from_slice(&seq.to_le_bytes());
        let len = u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
        let crc = checksum(&record[RECORD_HEAD..RECORD_HEAD + len]);
        record[8..12].copy_from_slice(&crc.to_le_bytes());
        record
    }

    /// A log an older lanefs left (header `lanefsI2`, records sealed with crc32) is still
    /// read after an upgrade, damage stepped over as before: its crash's changes are
    /// replayed.
    #[test]
    fn a_log_of_the_old_format_is_still_read() {
        let mut content = vec![0u8; RECORDS_START as usize];
        content[..HEADER_V2.len()].copy_from_slice(HEADER_V2);
        let expected: Vec<(u64, Intent)> = (1..).zip(samples()).collect();
        for (seq, intent) in &expected {
            content.extend_from_slice(&sealed_with_crc(intent, *seq));
        }
        content.resize(content.len() + 4096, 0);
        let (records, skipped) = parse(&content).unwrap();
        assert_eq!((records, skipped), (expected.clone(), 0));
        // Sealed with a key instead, in an old log: not its records.
        let mut keyed = content[..RECORDS_START as usize].to_vec();
        for (seq, intent) in &expected {
            let mut record = intent.encode();
            seal(&mut record, *seq, &[1; KEY_BYTES]);
            keyed.extend_from_slice(&record);
        }
        assert_eq!(parse(&keyed).unwrap().0, Vec::new());
    }

    /// A log whose header is zeros (a crash before a lanefs of the old format wrote it back)
    /// holds nothing a replay could vouch for: it reads as empty instead of failing every
    /// later mount with "not a lanefs intent log". A new log's header is on disk before it is
    /// used.
    #[test]
    fn a_log_without_its_header_reads_as_empty() {
        let mut content = vec![0u8; LOG_BYTES as usize];
        assert_eq!(parse(&content), Some((Vec::new(), 0)));
        content[RECORDS_START as usize] = 1;
        assert_eq!(parse(&content).map(|(r, _)| r.len()), Some(0));
        let dir = TempDir::new("header");
        let log = IntentLog::create(dir.path(), 2).unwrap();
        let on_disk = std::fs::read(log.path()).unwrap();
        assert!(on_disk.starts_with(HEADER));
        assert_eq!(&on_disk[KEY_AT..KEY_AT + KEY_BYTES], &log.key);
        assert_ne!(log.key, [0; KEY_BYTES]);
    }

    #[test]
    fn a_dead_sessions_log_is_found_and_its_own_is_skipped() {
        let dir = TempDir::new("dead");
        let dead = IntentLog::create(dir.path(), 8).unwrap();
        dead.append(samples()[2].encode(), |_| {});
        drop(dead); // its process "died": the lock is gone with the fd
        let own = IntentLog::create(dir.path(), 9).unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let logs = dead_logs(dir.path(), Some(9)).unwrap();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].session, 8);
        assert_eq!(logs[0].records, vec![(1, samples()[2].clone())]);
        // Locked by the replay that found it: nobody else replays it at the same time.
        assert!(dead_logs(dir.path(), Some(9)).unwrap().is_empty());
        drop(own);
    }

    #[test]
    fn a_watermark_covers_what_finished_out_of_order() {
        let w = Watermark::default().with([1, 2, 4, 7]);
        assert_eq!((w.applied, w.above_text()), (2, "4,7".to_string()));
        assert!(w.covers(1) && w.covers(4) && !w.covers(3) && !w.covers(5));
        let w = w.with([3, 5, 6]);
        assert_eq!(
            w,
            Watermark {
                applied: 7,
                above: BTreeSet::new()
            }
        );
        assert_eq!(
            Watermark::parse(2, "4,7"),
            Watermark::default().with([1, 2, 4, 7])
        );
        assert_eq!(Watermark::parse(9, ""), Watermark::default().with(1..=9));
    }

    #[test]
    fn the_log_is_emptied_only_when_everything_in_it_is_finished() {
        let dir = TempDir::new("empty");
        let log = IntentLog::create(dir.path(), 1).unwrap();
        let big = big_record();
        while log.tail.load(Ordering::SeqCst) < LOG_BYTES / 2 {
            log.append(big.encode(), |_| {});
        }
        let long = log.tail.load(Ordering::SeqCst);
        let all_but_last = Watermark::default().with(1..log.last());
        log.committed(&all_but_last);
        assert_eq!(log.tail.load(Ordering::SeqCst), long);
        // The first one overtaken: not all finished.
        log.committed(&Watermark::default().with(2..=log.last()));
        assert_eq!(log.tail.load(Ordering::SeqCst), long);
        let all = all_but_last.with([log.last()]);
        log.committed(&all);
        assert_eq!(log.tail.load(Ordering::SeqCst), RECORDS_START);
        // The next record goes over the first; the finished ones a replay skips.
        log.append(samples()[0].encode(), |_| {});
        let (records, _) = parse(&std::fs::read(log.path()).unwrap()).unwrap();
        let left: Vec<u64> = records
            .iter()
            .map(|(seq, _)| *seq)
            .filter(|&seq| !all.covers(seq))
            .collect();
        assert_eq!(left, vec![log.last()]);
    }

    /// With nothing finishing (the database gone), a full log keeps no writer waiting
    /// longer than `FULL_WAIT_MAX`: the records go to the file past the mapping, all of
    /// them readable; the next emptying cuts the file back.
    #[test]
    fn a_full_log_with_nothing_finishing_writes_past_its_mapping() {
        let dir = TempDir::new("full");
        let log = IntentLog::create(dir.path(), 1).unwrap();
        let big = big_record();
        while log.tail.load(Ordering::SeqCst) <= LOG_BYTES {
            let started = std::time::Instant::now();
            log.append(big.encode(), |_| {});
            assert!(
                started.elapsed() < FULL_WAIT_MAX * 5,
                "a writer waited on a full log"
            );
        }
        log.append(big.encode(), |_| {});
        let content = std::fs::read(log.path()).unwrap();
        assert!(content.len() as u64 > LOG_BYTES);
        let (records, _) = parse(&content).unwrap();
        let numbers: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(numbers, (1..=log.last()).collect::<Vec<u64>>());
        assert!(log.committed(&Watermark::default().with(1..=log.last())));
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), LOG_BYTES);
    }

    /// What waits for the database, as the mount's gate on early answers reads it: the
    /// changes numbered and not finished, counted whether they committed or failed, and
    /// whether the mapping is used up.
    #[test]
    fn the_backlog_counts_numbered_changes_not_finished() {
        let dir = TempDir::new("backlog");
        let log = IntentLog::create(dir.path(), 1).unwrap();
        assert_eq!(log.backlog(), 0);
        for intent in samples() {
            log.append(intent.encode(), |_| {});
        }
        assert_eq!(log.backlog(), 5);
        // 1, 2 and 4 over (4 overtook 3): two wait.
        log.note_finished(&Watermark::default().with([1, 2, 4]));
        assert_eq!(log.backlog(), 2);
        log.note_finished(&Watermark::default().with(1..=5));
        assert_eq!(log.backlog(), 0);
        assert!(!log.full());
        let big = big_record();
        while log.tail.load(Ordering::SeqCst) < LOG_BYTES {
            log.append(big.encode(), |_| {});
        }
        assert!(log.full());
        assert!(log.committed(&Watermark::default().with(1..=log.last())));
        assert!(!log.full());
    }

    /// Writers on four threads and a committer emptying the log whenever it may, with
    /// changes finished as soon as they are queued (as a fast commit would): the log is
    /// emptied many times and writers wait when it is full, and every record the last
    /// emptying's watermark does not cover is still there, whole. (A stress test: the window
    /// where an emptying meets a copy is too narrow for two CPUs to hit reliably; the
    /// protocol's argument is in `committed`.)
    #[test]
    fn records_outlive_concurrent_emptyings() {
        use std::sync::{Arc, Mutex};
        let dir = TempDir::new("race");
        let log = Arc::new(IntentLog::create(dir.path(), 1).unwrap());
        let finished = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let committer = {
            let (log, finished, done) = (log.clone(), finished.clone(), done.clone());
            std::thread::spawn(move || {
                let mut wm = Watermark::default();
                // The watermark of the last emptying: only the records it covered may go.
                let mut at_last_emptying = Watermark::default();
                let mut emptied = 0;
                while !done.load(Ordering::SeqCst) {
                    wm = wm.with(std::mem::take(&mut *finished.lock().unwrap()));
                    if log.committed(&wm) {
                        emptied += 1;
                        at_last_emptying = wm.clone();
                    }
                    std::thread::yield_now();
                }
                (at_last_emptying, emptied)
            })
        };
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let (log, finished) = (log.clone(), finished.clone());
                std::thread::spawn(move || {
                    for i in 0..3_000u64 {
                        let intent = Intent::Inline(InlineUpdate {
                            ino: t,
                            size: i,
                            mtime_ns: 0,
                            ctime_ns: 0,
                            bytes: vec![t as u8; 4_000],
                        });
                        log.append(intent.encode(), |seq| finished.lock().unwrap().push(seq));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        // Once at most half full (the committer empties a fuller one now that all is
        // finished), the committer stops; records after that are never finished.
        while log.tail.load(Ordering::SeqCst) >= LOG_BYTES / 2 {
            std::thread::yield_now();
        }
        done.store(true, Ordering::SeqCst);
        let (wm, emptied) = committer.join().unwrap();
        for _ in 0..20 {
            log.append(
                Intent::Inline(InlineUpdate {
                    ino: 9,
                    bytes: vec![9; 4_000],
                    ..InlineUpdate::default()
                })
                .encode(),
                |_| {},
            );
        }
        assert!(emptied > 2, "the log was emptied {emptied} times");
        let (records, _) = parse(&std::fs::read(log.path()).unwrap()).unwrap();
        let present: BTreeSet<u64> = records.iter().map(|(seq, _)| *seq).collect();
        let kept: Vec<u64> = (1..=log.last()).filter(|&seq| !wm.covers(seq)).collect();
        assert!(!kept.is_empty(), "records came after the last emptying");
        for seq in kept {
            assert!(present.contains(&seq), "record {seq} was lost");
        }
        for (_, intent) in &records {
            let Intent::Inline(u) = intent else {
                panic!("not a record of this test: {intent:?}")
            };
            assert_eq!(u.bytes, vec![u.ino as u8; 4_000]);
        }
    }
}
