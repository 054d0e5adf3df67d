//! The intent log (issue 15): every change answered before its commit (an early create,
//! remove, attribute change or new small file's bytes, see `dirops`) is appended to a file of
//! the session's on local disk before it is answered, and the committer records in the same
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
//! - *What a record survives.* It is written (not synced) before the answer: a kill -9 of the
//!   daemon leaves it in the page cache, so nothing answered is lost. A machine crash loses
//!   what the OS had not written, which is never what fsync acknowledged (fsync waits for the
//!   commit, as before).
//! - *Which log is whose.* `<dir>/<session>.log`, held with flock for the session's life.
//!   A mount takes every other log of the directory it can lock (its writer is dead; two
//!   mounts of one volume on one machine keep apart so), replays it, removes the file and
//!   then the row. A record is applied with the watermark's advance in one transaction, so a
//!   replay cut short by another crash goes on where it stopped.
//! - *Conflicts.* A record is applied by the same code and checks as the synchronous change
//!   (`ops`): one that no longer fits (on a shared volume another mount took the name after
//!   this one's lease expired, a directory is gone) is logged with its name and cause and
//!   dropped; the others are still applied.
//! - *Size.* The file is emptied whenever every change numbered so far is finished and it
//!   has grown past `LOG_BYTES_MAX`. A record written while that happens (its number came
//!   after the check) is written again after it (`IntentLog::empties`, a sequence count).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::blocks::checksum;
use crate::meta::{AttrChange, InlineUpdate, NewNode};

/// The first bytes of a log file, with its format's version.
const HEADER: &[u8; 8] = b"lanefsI1";
/// Each record: payload length (u32), crc32 of the rest (u32), then the rest: number (u64),
/// kind (u8), payload.
const RECORD_HEAD: usize = 8;
/// A record longer than this is damage, not a change (the largest is a new file's inline
/// bytes, at most 64 KiB, or a create's inherited ACLs).
const RECORD_BYTES_MAX: usize = 4 << 20;
/// The log is emptied once everything in it committed and it is at least this long.
const LOG_BYTES_MAX: u64 = 16 << 20;

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
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc(vec![0; RECORD_HEAD + 8]);
        match self {
            Intent::Create(n) => {
                e.u8(1);
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
            }
            Intent::Remove {
                parent,
                name,
                dir,
                now_ns,
            } => {
                e.u8(2);
                e.u64(*parent);
                e.bytes(name);
                e.u8(u8::from(*dir));
                e.i64(*now_ns);
            }
            Intent::Inline(u) => {
                e.u8(3);
                e.u64(u.ino);
                e.u64(u.size);
                e.i64(u.mtime_ns);
                e.i64(u.ctime_ns);
                e.bytes(&u.bytes);
            }
            Intent::Setattr { ino, change } => {
                e.u8(4);
                e.u64(*ino);
                e.opt_u32(change.mode);
                e.opt_u32(change.uid);
                e.opt_u32(change.gid);
                e.opt_i64(change.atime_ns);
                e.opt_i64(change.mtime_ns);
                e.i64(change.ctime_ns);
            }
        }
        let mut record = e.0;
        let len = (record.len() - RECORD_HEAD) as u32;
        record[..4].copy_from_slice(&len.to_le_bytes());
        record
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
                    ino: Some(ino),
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

/// This session's log.
pub struct IntentLog {
    path: PathBuf,
    /// Opened for appending and held with flock (LOCK_EX) until the process ends.
    file: File,
    /// The next record's number.
    next: AtomicU64,
    /// Times the file was emptied, twice each: odd while it is being emptied. A record
    /// whose write may have met an emptying is written again (see `append`).
    empties: AtomicU64,
    /// Bytes appended since the file was last emptied.
    bytes: AtomicU64,
    /// A record could not be written (the log's disk full): said once until one is again.
    failing: AtomicBool,
    /// Records that could not be written (`lanefs stats`: `intent_log_errors`).
    pub errors: AtomicU64,
}

impl IntentLog {
    /// Makes `dir` if needed and this session's log in it, locked.
    pub fn create(dir: &Path, session: u64) -> Result<IntentLog, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("the intent log's directory {}: {e}", dir.display()))?;
        let path = dir.join(format!("{session}.log"));
        let mut file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !try_lock(&file) {
            return Err(format!("{}: held by another process", path.display()));
        }
        file.write_all(HEADER)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(IntentLog {
            path,
            file,
            next: AtomicU64::new(1),
            empties: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Numbers `record`, runs `enqueue` with the number (it puts the change on the
    /// committer's queue), then appends the record. A failed append loses only the
    /// protection from a crash: the change is queued and commits as any other.
    pub fn append(&self, mut record: Vec<u8>, enqueue: impl FnOnce(u64)) {
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        enqueue(seq);
        record[RECORD_HEAD..RECORD_HEAD + 8].copy_from_slice(&seq.to_le_bytes());
        let crc = checksum(&record[RECORD_HEAD..]);
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        // An emptying that began before this number was taken may not have counted it and
        // may cut the write: if one was under way or happened during the write, the record
        // is written again once it is over (a record twice is read once).
        loop {
            let before = self.empties.load(Ordering::SeqCst);
            let written = self.write_record(&record);
            let after = self.empties.load(Ordering::SeqCst);
            if !written || (before == after && before.is_multiple_of(2)) {
                return;
            }
            while !self.empties.load(Ordering::SeqCst).is_multiple_of(2) {
                std::thread::yield_now();
            }
        }
    }

    /// One write(2) of an O_APPEND file: the record lands whole and after the others.
    fn write_record(&self, record: &[u8]) -> bool {
        match (&self.file).write_all(record) {
            Ok(()) => {
                self.bytes.fetch_add(record.len() as u64, Ordering::Relaxed);
                self.failing.store(false, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "volume: cannot write the intent log {}: {e}; changes answered before their commit are lost if the daemon dies before it",
                        self.path.display()
                    );
                }
                false
            }
        }
    }

    /// `finished` was committed: empties the file when it is long and every number handed
    /// out so far is finished. Only the committer calls it (one emptying at a time).
    pub fn committed(&self, finished: &Watermark) {
        if self.bytes.load(Ordering::Relaxed) < LOG_BYTES_MAX || !finished.above.is_empty() {
            return;
        }
        // Odd before the numbers are looked at: a number taken after this load finds it
        // odd, or the emptying over, when its write ends.
        self.empties.fetch_add(1, Ordering::SeqCst);
        if self.last() == finished.applied {
            match self.file.set_len(HEADER.len() as u64) {
                Ok(()) => self.bytes.store(0, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(
                        "volume: emptying the intent log {}: {e}",
                        self.path.display()
                    )
                }
            }
        }
        self.empties.fetch_add(1, Ordering::SeqCst);
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
    /// Bytes past the last whole record (a write cut short by the kill, or damage).
    pub torn_bytes: usize,
}

/// The logs in `dir` other than `own` whose writers are dead (their flock can be taken).
pub fn dead_logs(dir: &Path, own: Option<u64>) -> Result<Vec<DeadLog>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("the intent log's directory {}: {e}", dir.display())),
    };
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
        let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if !try_lock(&file) {
            continue; // its mount is alive
        }
        let mut content = Vec::new();
        file.read_to_end(&mut content)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (records, torn_bytes) = parse(&content)
            .ok_or_else(|| format!("{} is not a lanefs intent log", path.display()))?;
        logs.push(DeadLog {
            session,
            path,
            _file: file,
            records,
            torn_bytes,
        });
    }
    logs.sort_by_key(|l| l.session);
    Ok(logs)
}

/// A log's whole records in number order and the bytes after them; None without the header
/// (an empty file, made and never written, counts as empty).
fn parse(content: &[u8]) -> Option<(Vec<(u64, Intent)>, usize)> {
    if content.is_empty() {
        return Some((Vec::new(), 0));
    }
    let mut rest = content.strip_prefix(HEADER.as_slice())?;
    let mut records = Vec::new();
    while rest.len() >= RECORD_HEAD {
        let len = u32::from_le_bytes(rest[..4].try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().ok()?);
        if len > RECORD_BYTES_MAX || rest.len() < RECORD_HEAD + len {
            break;
        }
        let body = &rest[RECORD_HEAD..RECORD_HEAD + len];
        if checksum(body) != crc {
            break;
        }
        let Some(record) = Intent::decode(body) else {
            break;
        };
        records.push(record);
        rest = &rest[RECORD_HEAD + len..];
    }
    records.sort_by_key(|(seq, _)| *seq);
    records.dedup_by_key(|(seq, _)| *seq);
    Some((records, rest.len()))
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

    #[test]
    fn records_come_back_in_number_order_and_a_torn_tail_ends_them() {
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
        drop(log);
        let (records, torn) = parse(&content).unwrap();
        assert_eq!(torn, 0);
        let expected: Vec<(u64, Intent)> = (1..).zip(samples()).collect();
        assert_eq!(records, expected);
        // A write cut short, then damage: the whole records before them stand.
        let whole = content.len();
        content.extend_from_slice(&[9, 0, 0, 0, 1, 2]);
        assert_eq!(parse(&content).unwrap(), (expected.clone(), 6));
        content.truncate(whole);
        let last = content.len() - 1;
        content[last] ^= 0xff;
        let (records, torn) = parse(&content).unwrap();
        assert_eq!(records, expected[..4].to_vec());
        assert!(torn > 0);
        assert!(parse(b"not a log").is_none());
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
    fn the_file_is_emptied_only_when_everything_in_it_committed() {
        let dir = TempDir::new("empty");
        let log = IntentLog::create(dir.path(), 1).unwrap();
        let big = Intent::Inline(InlineUpdate {
            ino: 5,
            size: 60_000,
            mtime_ns: 0,
            ctime_ns: 0,
            bytes: vec![7; 60_000],
        });
        while log.bytes.load(Ordering::Relaxed) < LOG_BYTES_MAX {
            log.append(big.encode(), |_| {});
        }
        let long = std::fs::metadata(log.path()).unwrap().len();
        let all_but_last = Watermark::default().with(1..log.last());
        log.committed(&all_but_last);
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), long);
        // The first one overtaken: not all finished.
        log.committed(&Watermark::default().with(2..=log.last()));
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), long);
        log.committed(&all_but_last.with([log.last()]));
        assert_eq!(
            std::fs::metadata(log.path()).unwrap().len(),
            HEADER.len() as u64
        );
        log.append(samples()[0].encode(), |_| {});
        let (records, _) = parse(&std::fs::read(log.path()).unwrap()).unwrap();
        assert_eq!(records.len(), 1);
    }
}
