//! `SqliteStore`: the MetaStore on an SQLite file. Reads run on the caller's thread on a read
//! connection of its own queue; every change runs on one writer thread, which joins whatever is
//! queued into one transaction (group commit) and answers each change after the commit.

use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};

use crate::meta::*;
use crate::schema::{self, counter};

/// Read connections; a queue uses `queue % READ_CONNECTIONS` (or any idle one).
pub const READ_CONNECTIONS: usize = 8;
/// Changes joined into one transaction at most.
pub const BATCH_OPS_MAX: usize = 256;
/// Inode numbers taken from the counter at a time (one row in `inode_ranges` each).
pub const INODE_RANGE: u64 = 1024;
/// Attempts at BEGIN IMMEDIATE while another process holds the write lock.
pub const BUSY_RETRIES: u32 = 50;
/// SQLite's own wait on a lock before it reports BUSY to us.
pub const BUSY_TIMEOUT: Duration = Duration::from_millis(100);
/// Our wait between BUSY retries grows by this much each time (50 tries: ~6 s in all).
pub const BUSY_BACKOFF_STEP: Duration = Duration::from_millis(5);

/// How often the checkpointer folds the WAL into the database. The writer never checkpoints
/// (`wal_autocheckpoint=0`): a checkpoint fsyncs the database file, which would stall every
/// change queued behind it; in its own thread and connection it runs beside the commits.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// An inode's columns as `attr_from_row` reads them; a macro so that the statements below are
/// `const` text (no string is built per lookup or getattr).
macro_rules! attr_columns {
    () => {
        "i.ino, i.mode, i.uid, i.gid, i.rdev, i.nlink, i.size, i.atime_ns, i.mtime_ns, i.ctime_ns, i.parent"
    };
}
const GETATTR_SQL: &str = concat!("SELECT ", attr_columns!(), " FROM inodes i WHERE i.ino = ?");
// A subquery, not a join: SQLite marks a join's parameters as able to change its plan, and
// then re-prepares the statement each time rusqlite's cache clears its bindings (16 µs a
// lookup instead of 2.5 µs, measured).
const LOOKUP_SQL: &str = concat!(
    "SELECT ",
    attr_columns!(),
    " FROM inodes i WHERE i.ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?)"
);
const READDIR_SQL: &str = concat!(
    "SELECT e.name, ",
    attr_columns!(),
    " FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ? ORDER BY e.name"
);
/// A freed inode's rows, besides its chunks.
const FREE_INODE_SQL: [&str; 4] = [
    "DELETE FROM inodes WHERE ino = ?",
    "DELETE FROM xattrs WHERE ino = ?",
    "DELETE FROM symlinks WHERE ino = ?",
    "DELETE FROM orphans WHERE ino = ?",
];

/// Opens a connection with the volume's settings: WAL, synchronous=NORMAL (see
/// ARCHITECTURE.md, "Durability"), a busy timeout, foreign keys not used.
pub fn connect(path: &Path, write: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    flags |= if write {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    };
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    if write {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::InvalidQuery);
        }
    }
    conn.execute_batch("PRAGMA synchronous=NORMAL")?;
    Ok(conn)
}

/// Creates every table of the newest schema in an empty database (inside the caller's
/// transaction), recording each step.
pub fn create_schema(conn: &Connection, now_ns: i64) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_ns BIGINT NOT NULL)",
    )?;
    for (i, step) in schema::STEPS.iter().enumerate() {
        conn.execute_batch(&schema::step_for(step, "BLOB"))?;
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_ns) VALUES (?, ?)",
            params![i as i64 + 1, now_ns],
        )?;
    }
    Ok(())
}

/// Creates the schema and the root directory in an empty database.
pub fn initialize(
    conn: &Connection,
    settings: &[(&str, String)],
    root: &InodeRec,
) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        create_schema(conn, root.ctime_ns)?;
        for (name, value) in settings {
            conn.execute(
                "INSERT INTO settings (name, value) VALUES (?, ?)",
                params![name, value],
            )?;
        }
        conn.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?), (?, ?)",
            params![
                counter::NEXT_INODE,
                ROOT_INO as i64 + 1,
                counter::NEXT_SESSION,
                1i64
            ],
        )?;
        insert_inode(conn, root, None)?;
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn insert_inode(conn: &Connection, a: &InodeRec, inline: Option<&[u8]>) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO inodes (ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent, inline_data)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        a.ino as i64,
        a.mode as i64,
        a.uid as i64,
        a.gid as i64,
        a.rdev as i64,
        a.nlink as i64,
        a.size as i64,
        a.atime_ns,
        a.mtime_ns,
        a.ctime_ns,
        a.parent as i64,
        inline
    ])?;
    Ok(())
}

fn attr_from_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<InodeRec> {
    Ok(InodeRec {
        ino: r.get::<_, i64>(at)? as u64,
        mode: r.get::<_, i64>(at + 1)? as u32,
        uid: r.get::<_, i64>(at + 2)? as u32,
        gid: r.get::<_, i64>(at + 3)? as u32,
        rdev: r.get::<_, i64>(at + 4)? as u32,
        nlink: r.get::<_, i64>(at + 5)? as u32,
        size: r.get::<_, i64>(at + 6)? as u64,
        atime_ns: r.get(at + 7)?,
        mtime_ns: r.get(at + 8)?,
        ctime_ns: r.get(at + 9)?,
        parent: r.get::<_, i64>(at + 10)? as u64,
    })
}

/// An SQL error inside an operation: logged once; ENOSPC when the database's disk is full,
/// else EIO, to the caller.
fn db(e: rusqlite::Error) -> Errno {
    tracing::error!("volume metadata: {e}");
    errno_of(&e)
}

fn errno_of(e: &rusqlite::Error) -> Errno {
    match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::DiskFull => libc::ENOSPC,
        _ => libc::EIO,
    }
}

fn is_constraint(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ConstraintViolation)
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == ErrorCode::DatabaseBusy || f.code == ErrorCode::DatabaseLocked)
}

fn read_attr(conn: &Connection, ino: u64) -> Result<InodeRec, Errno> {
    conn.prepare_cached(GETATTR_SQL)
        .and_then(|mut s| {
            s.query_row([ino as i64], |r| attr_from_row(r, 0))
                .optional()
        })
        .map_err(db)?
        .ok_or(libc::ENOENT)
}

/// The state the writer thread owns: its connection, its session, its inode range.
pub struct Writer {
    conn: Connection,
    session: u64,
    next_ino: u64,
    end_ino: u64,
}

impl Writer {
    fn alloc_ino(&mut self) -> u64 {
        debug_assert!(
            self.next_ino < self.end_ino,
            "ranges are refilled before each batch"
        );
        let ino = self.next_ino;
        self.next_ino += 1;
        ino
    }

    /// Makes sure `need` inode numbers are left in the range, taking a new range if not.
    fn refill(&mut self, need: u64) -> rusqlite::Result<()> {
        if self.end_ino - self.next_ino >= need {
            return Ok(());
        }
        let end: i64 = self.conn.query_row(
            "UPDATE counters SET value = value + ? WHERE name = ? RETURNING value",
            params![INODE_RANGE as i64, counter::NEXT_INODE],
            |r| r.get(0),
        )?;
        let start = end as u64 - INODE_RANGE;
        self.conn.execute(
            "INSERT INTO inode_ranges (start_ino, end_ino, session) VALUES (?, ?, ?)",
            params![start as i64, end, self.session as i64],
        )?;
        self.next_ino = start;
        self.end_ino = end as u64;
        Ok(())
    }

    fn touch_dir(&self, dir: u64, now_ns: i64, nlink_delta: i64) -> Result<(), Errno> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE ino = ? AND nlink > 0",
            )
            .and_then(|mut s| s.execute(params![now_ns, now_ns, nlink_delta, dir as i64]))
            .map_err(db)?;
        if n == 0 { Err(libc::ENOENT) } else { Ok(()) }
    }

    /// As `touch_dir`, returning the directory's (mode, gid) in the same statement.
    fn touch_dir_returning(
        &self,
        dir: u64,
        now_ns: i64,
        nlink_delta: i64,
    ) -> Result<(u32, u32), Errno> {
        self.conn
            .prepare_cached(
                "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE ino = ? AND nlink > 0
                 RETURNING mode, gid",
            )
            .and_then(|mut s| {
                s.query_row(params![now_ns, now_ns, nlink_delta, dir as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u32))
                })
                .optional()
            })
            .map_err(db)?
            .ok_or(libc::ENOENT)
    }

    /// (ino, mode, nlink) of the entry.
    fn entry(&self, parent: u64, name: &[u8]) -> Result<Option<(u64, u32, u32)>, Errno> {
        self.conn
            .prepare_cached(
                // A subquery, not a join: see `lookup`.
                "SELECT i.ino, i.mode, i.nlink FROM inodes i
                 WHERE i.ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?)",
            )
            .and_then(|mut s| {
                s.query_row(params![parent as i64, name], |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, i64>(1)? as u32,
                        r.get::<_, i64>(2)? as u32,
                    ))
                })
                .optional()
            })
            .map_err(db)
    }

    fn insert_entry(&self, parent: u64, name: &[u8], ino: u64, mode: u32) -> Result<(), Errno> {
        match self
            .conn
            .prepare_cached("INSERT INTO entries (parent, name, ino, kind) VALUES (?, ?, ?, ?)")
            .and_then(|mut s| s.execute(params![parent as i64, name, ino as i64, kind_of(mode)]))
        {
            Ok(_) => Ok(()),
            Err(e) if is_constraint(&e) => Err(libc::EEXIST),
            Err(e) => Err(db(e)),
        }
    }

    fn delete_entry(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.conn
            .prepare_cached("DELETE FROM entries WHERE parent = ? AND name = ?")
            .and_then(|mut s| s.execute(params![parent as i64, name]))
            .map_err(db)?;
        Ok(())
    }

    fn is_empty_dir(&self, dir: u64) -> Result<bool, Errno> {
        let any: Option<i64> = self
            .conn
            .prepare_cached("SELECT 1 FROM entries WHERE parent = ? LIMIT 1")
            .and_then(|mut s| s.query_row([dir as i64], |r| r.get(0)).optional())
            .map_err(db)?;
        Ok(any.is_none())
    }

    /// Moves a chunk's block to gc_blocks; returns it.
    fn release_chunks(
        &self,
        ino: u64,
        from_idx: u64,
        only: Option<u64>,
        now_ns: i64,
    ) -> Result<Vec<u64>, Errno> {
        let (select, delete, arg2) = match only {
            Some(idx) => (
                "SELECT block FROM chunks WHERE ino = ? AND idx = ?",
                "DELETE FROM chunks WHERE ino = ? AND idx = ?",
                idx as i64,
            ),
            None => (
                "SELECT block FROM chunks WHERE ino = ? AND idx >= ?",
                "DELETE FROM chunks WHERE ino = ? AND idx >= ?",
                from_idx as i64,
            ),
        };
        let blocks: Vec<u64> = self
            .conn
            .prepare_cached(select)
            .and_then(|mut s| {
                s.query_map(params![ino as i64, arg2], |r| r.get::<_, i64>(0))?
                    .map(|b| b.map(|b| b as u64))
                    .collect()
            })
            .map_err(db)?;
        if blocks.is_empty() {
            return Ok(blocks);
        }
        for b in &blocks {
            self.conn
                .prepare_cached("INSERT INTO gc_blocks (block, since_ns) VALUES (?, ?) ON CONFLICT (block) DO NOTHING")
                .and_then(|mut s| s.execute(params![*b as i64, now_ns]))
                .map_err(db)?;
        }
        self.conn
            .prepare_cached(delete)
            .and_then(|mut s| s.execute(params![ino as i64, arg2]))
            .map_err(db)?;
        Ok(blocks)
    }

    /// Deletes an inode and everything hanging off it; returns its released blocks.
    fn free_inode(&self, ino: u64, now_ns: i64) -> Result<Vec<u64>, Errno> {
        let released = self.release_chunks(ino, 0, None, now_ns)?;
        for sql in FREE_INODE_SQL {
            self.conn
                .prepare_cached(sql)
                .and_then(|mut s| s.execute([ino as i64]))
                .map_err(db)?;
        }
        Ok(released)
    }

    /// Drops one link of a non-directory: at zero, orphan (open) or free.
    fn drop_link(
        &self,
        ino: u64,
        nlink: u32,
        now_ns: i64,
        is_open: &IsOpen,
    ) -> Result<Removed, Errno> {
        let mut removed = Removed {
            ino,
            ..Default::default()
        };
        if nlink > 1 {
            self.conn
                .prepare_cached("UPDATE inodes SET nlink = nlink - 1, ctime_ns = ? WHERE ino = ?")
                .and_then(|mut s| s.execute(params![now_ns, ino as i64]))
                .map_err(db)?;
        } else if is_open(ino) {
            self.conn
                .prepare_cached("UPDATE inodes SET nlink = 0, ctime_ns = ? WHERE ino = ?")
                .and_then(|mut s| s.execute(params![now_ns, ino as i64]))
                .map_err(db)?;
            self.conn
                .prepare_cached(
                    "INSERT INTO orphans (ino, session) VALUES (?, ?) ON CONFLICT (ino) DO NOTHING",
                )
                .and_then(|mut s| s.execute(params![ino as i64, self.session as i64]))
                .map_err(db)?;
            removed.orphaned = true;
        } else {
            removed.released = self.free_inode(ino, now_ns)?;
        }
        Ok(removed)
    }

    fn attr(&self, ino: u64) -> Result<InodeRec, Errno> {
        read_attr(&self.conn, ino)
    }
}

/// The DT_ type of a mode, as entries.kind.
pub fn kind_of(mode: u32) -> i64 {
    ((mode & libc::S_IFMT) >> 12) as i64
}

/// A change waiting for the writer.
trait Job: Send {
    /// Runs inside the batch's transaction (in a savepoint of its own).
    fn apply(&mut self, w: &mut Writer);
    /// After the commit (`Ok`) or its failure (the errno): answers.
    fn finish(self: Box<Self>, committed: Result<(), Errno>);
    fn sync(&self) -> bool;
}

struct Change<T, F> {
    op: Option<F>,
    result: Option<Result<T, Errno>>,
    done: Done<T>,
    sync: bool,
}

impl<T: Send, F: FnOnce(&mut Writer) -> Result<T, Errno> + Send> Job for Change<T, F> {
    fn apply(&mut self, w: &mut Writer) {
        let Some(op) = self.op.take() else { return };
        if let Err(e) = w.conn.execute_batch("SAVEPOINT op") {
            self.result = Some(Err(db(e)));
            return;
        }
        // A panic in an operation (a bug) must not take the writer, and with it every later
        // change of the mount, down: the operation's savepoint is rolled back and it gets EIO.
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(w))) {
            Ok(result) => result,
            Err(panic) => {
                tracing::error!(
                    "volume: a metadata change panicked ({}); it is rolled back and answered EIO",
                    panic_text(&*panic)
                );
                Err(libc::EIO)
            }
        };
        let end = match result {
            Ok(_) => "RELEASE op",
            Err(_) => "ROLLBACK TO op; RELEASE op",
        };
        self.result = Some(match w.conn.execute_batch(end) {
            Ok(()) => result,
            Err(e) => Err(db(e)),
        });
    }

    fn finish(self: Box<Self>, committed: Result<(), Errno>) {
        let result = match (self.result, committed) {
            (Some(Ok(v)), Ok(())) => Ok(v),
            (Some(Ok(_)), Err(e)) => Err(e),
            (None, _) => Err(libc::EIO),
            (Some(Err(e)), _) => Err(e),
        };
        (self.done)(result)
    }

    fn sync(&self) -> bool {
        self.sync
    }
}

enum Msg {
    Job(Box<dyn Job>),
    /// End the session and stop the writer.
    Close,
}

/// A background thread and the sender whose message (or end) stops it.
type Stoppable = (Sender<()>, JoinHandle<()>);

pub struct SqliteStore {
    /// Read connections. Each mutex protects one connection (rusqlite's are not Sync); a
    /// queue takes its own (`queue % READ_CONNECTIONS`) or any idle one. Leaf locks.
    readers: Vec<Mutex<Connection>>,
    /// The queue of changes. `Sender` is Sync: every queue sends without a lock of ours.
    jobs: Sender<Msg>,
    /// The writing side (see [`Committer`]); whoever holds the mutex commits what is queued.
    /// Held for the batches of one drain. Taken after anything a caller of `submit` holds
    /// (a file's `flushing` mutex and write gate); inside it only the open table's shard
    /// locks (`is_open`), which are leaves.
    committer: Arc<Mutex<Committer>>,
    /// Wakes the writer thread when a change was queued while the committer was busy.
    wake: Sender<()>,
    /// The writer thread, joined by `close`. Taken once.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Stops and joins the checkpointer; taken once, by `close`.
    checkpointer: Mutex<Option<Stoppable>>,
    pub session: u64,
    /// Sessions whose rows this one found (they ended without unmounting).
    crashed: Vec<u64>,
}

impl SqliteStore {
    /// Opens the volume's database for a mount: registers a session, frees what dead sessions
    /// left (their orphans, ranges, rows), starts the writer.
    pub fn open(
        path: &Path,
        host: &str,
        mountpoint: &str,
        now_ns: i64,
    ) -> rusqlite::Result<SqliteStore> {
        let conn = connect(path, true)?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let session: i64 = conn.query_row(
            "UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value - 1",
            [counter::NEXT_SESSION],
            |r| r.get(0),
        )?;
        conn.execute(
            "INSERT INTO sessions (id, host, pid, mountpoint, started_ns, heartbeat_ns) VALUES (?, ?, ?, ?, ?, ?)",
            params![session, host, std::process::id() as i64, mountpoint, now_ns, now_ns],
        )?;
        let w = Writer {
            conn,
            session: session as u64,
            next_ino: 0,
            end_ino: 0,
        };
        let crashed: Vec<u64> = w
            .conn
            .prepare("SELECT id FROM sessions WHERE id <> ?")?
            .query_map([session], |r| r.get::<_, i64>(0))?
            .map(|id| id.map(|id| id as u64))
            .collect::<rusqlite::Result<_>>()?;
        let dead: Vec<i64> = w
            .conn
            .prepare("SELECT ino FROM orphans WHERE session <> ?")?
            .query_map([session], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for ino in &dead {
            w.free_inode(*ino as u64, now_ns)
                .map_err(|_| rusqlite::Error::InvalidQuery)?;
        }
        if !dead.is_empty() {
            tracing::info!(
                "freed {} files left open-but-unlinked by earlier mounts",
                dead.len()
            );
        }
        w.conn
            .execute("DELETE FROM inode_ranges WHERE session <> ?", [session])?;
        w.conn
            .execute("DELETE FROM sessions WHERE id <> ?", [session])?;
        w.conn.execute_batch("COMMIT")?;
        let mut readers = Vec::with_capacity(READ_CONNECTIONS);
        for _ in 0..READ_CONNECTIONS {
            readers.push(Mutex::new(connect(path, false)?));
        }
        w.conn.execute_batch("PRAGMA wal_autocheckpoint=0")?;
        let checkpoints = connect(path, true)?;
        let (stop_checkpoints, stop_rx) = channel::<()>();
        let checkpointer = std::thread::Builder::new()
            .name("lanefs-checkpoint".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(CHECKPOINT_INTERVAL)
                {
                    if let Err(e) = checkpoints.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::warn!("volume: checkpoint: {e}");
                    }
                }
            })
            .map_err(|_| rusqlite::Error::InvalidQuery)?;
        let (jobs, rx) = channel();
        let committer = Arc::new(Mutex::new(Committer {
            w: Some(w),
            rx,
            closed: false,
        }));
        let (wake, wake_rx) = channel();
        let writer = {
            let committer = committer.clone();
            std::thread::Builder::new()
                .name("lanefs-commit".into())
                .spawn(move || run_writer(committer, wake_rx))
                .map_err(|_| rusqlite::Error::InvalidQuery)?
        };
        Ok(SqliteStore {
            readers,
            jobs,
            committer,
            wake,
            writer: Mutex::new(Some(writer)),
            checkpointer: Mutex::new(Some((stop_checkpoints, checkpointer))),
            session: session as u64,
            crashed,
        })
    }

    fn reader(&self, queue: usize) -> MutexGuard<'_, Connection> {
        let n = self.readers.len();
        for i in 0..n {
            if let Ok(conn) = self.readers[(queue + i) % n].try_lock() {
                return conn;
            }
        }
        self.readers[queue % n]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn submit<T: Send + 'static>(
        &self,
        sync: bool,
        op: impl FnOnce(&mut Writer) -> Result<T, Errno> + Send + 'static,
        done: Done<T>,
    ) {
        let job = Box::new(Change {
            op: Some(op),
            result: None,
            done,
            sync,
        });
        if let Err(std::sync::mpsc::SendError(Msg::Job(job))) = self.jobs.send(Msg::Job(job)) {
            // The writer is gone (unmounted): nothing can be committed.
            job.finish(Err(libc::EIO));
            return;
        }
        // Commit on this thread when nobody is committing: a lone change (a create in a
        // shell loop) then costs no thread hand-off there and back, the largest part of its
        // latency on a busy 2-CPU machine. When the committer is busy, its holder or the
        // writer thread takes the change with the next batch (group commit as before).
        // The caller commits one batch at most, so a queue's worker never stays away from
        // its queue for long however busy the other queues keep the committer: a full batch
        // may have left changes behind, which the writer thread then takes.
        let more = match self.committer.try_lock() {
            Ok(mut c) => c.drain(Some(1)),
            Err(TryLockError::Poisoned(p)) => p.into_inner().drain(Some(1)),
            Err(TryLockError::WouldBlock) => true,
        };
        if more {
            let _ = self.wake.send(());
        }
    }
}

/// The writer's connection and the receiving end of the queue of changes. A caller of
/// `submit` that finds it free drains the queue itself; otherwise the writer thread is woken
/// and drains it once the holder lets go. Every queued change is thus committed: the one who
/// queued it either drains or wakes the thread, which drains after the current holder.
struct Committer {
    /// None once the session ended: `close` drops the connection there, so the database is
    /// closed before the volume's lock is let go.
    w: Option<Writer>,
    rx: Receiver<Msg>,
    /// The session ended (`close`): every change queued from now on is answered EIO.
    closed: bool,
}

impl Committer {
    /// Commits what is queued, in batches of up to `BATCH_OPS_MAX` changes, until the queue
    /// is empty or `batches` batches were committed; whether changes may be left (the last
    /// batch was full).
    fn drain(&mut self, batches: Option<usize>) -> bool {
        let mut committed = 0;
        loop {
            if batches.is_some_and(|most| committed >= most) {
                return true;
            }
            let mut batch: Vec<Box<dyn Job>> = Vec::new();
            while batch.len() < BATCH_OPS_MAX {
                match self.rx.try_recv() {
                    Ok(Msg::Job(job)) if self.closed || self.w.is_none() => {
                        job.finish(Err(libc::EIO))
                    }
                    Ok(Msg::Job(job)) => batch.push(job),
                    Ok(Msg::Close) => self.closed = true,
                    Err(_) => break,
                }
            }
            let full = batch.len() == BATCH_OPS_MAX;
            match &mut self.w {
                Some(w) if !batch.is_empty() => commit_batch(w, batch),
                _ => return false,
            }
            committed += 1;
            if !full {
                return false;
            }
        }
    }
}

/// The writer thread: drains the queue whenever a change was queued while the committer was
/// busy, and ends the session once `close` queued its message.
fn run_writer(committer: Arc<Mutex<Committer>>, wake: Receiver<()>) {
    while wake.recv().is_ok() {
        let mut c = committer.lock().unwrap_or_else(|e| e.into_inner());
        c.drain(None);
        if c.closed {
            if let Some(mut w) = c.w.take() {
                end_session(&mut w);
            }
            return;
        }
    }
}

/// Unmounted: ends the session and folds the WAL into the database.
fn end_session(w: &mut Writer) {
    let session = w.session as i64;
    let end = w.conn.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
        w.conn
            .execute("DELETE FROM inode_ranges WHERE session = ?", [session])?;
        w.conn
            .execute("DELETE FROM sessions WHERE id = ?", [session])?;
        w.conn.execute_batch("COMMIT")
    });
    if let Err(e) = end {
        tracing::warn!("volume: ending the session: {e}");
    }
    // Fold the WAL into the database so the file is whole on its own after unmount.
    if let Err(e) = w.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
        tracing::warn!("volume: final checkpoint: {e}");
    }
}

fn begin(w: &Writer) -> rusqlite::Result<()> {
    let mut tries = 0;
    loop {
        match w.conn.execute_batch("BEGIN IMMEDIATE") {
            Err(e) if is_busy(&e) && tries < BUSY_RETRIES => {
                tries += 1;
                if tries == 1 || tries % 10 == 0 {
                    tracing::warn!(
                        "volume: the database is busy (another process holds its write lock); try {tries} of {BUSY_RETRIES}"
                    );
                }
                std::thread::sleep(BUSY_BACKOFF_STEP * tries);
            }
            other => return other,
        }
    }
}

fn commit_batch(w: &mut Writer, mut batch: Vec<Box<dyn Job>>) {
    let sync = batch.iter().any(|j| j.sync());
    if sync && let Err(e) = w.conn.execute_batch("PRAGMA synchronous=FULL") {
        tracing::error!("volume: PRAGMA synchronous=FULL: {e}");
        answer(batch, Err(libc::EIO));
        return;
    }
    let committed = match begin(w) {
        Err(e) => {
            tracing::error!("volume: cannot start a transaction: {e}");
            Err(errno_of(&e))
        }
        Ok(()) => {
            let ready = w.refill(batch.len() as u64).map_err(|e| {
                tracing::error!("volume: taking inode numbers: {e}");
                errno_of(&e)
            });
            if ready.is_ok() {
                for job in batch.iter_mut() {
                    job.apply(w);
                }
            }
            let done = ready.and_then(|()| {
                w.conn.execute_batch("COMMIT").map_err(|e| {
                    tracing::error!("volume: commit of {} changes failed: {e}", batch.len());
                    errno_of(&e)
                })
            });
            if done.is_err() {
                let _ = w.conn.execute_batch("ROLLBACK");
            }
            done
        }
    };
    if committed.is_err() {
        // The range taken in this transaction (if any) was rolled back with it.
        w.next_ino = 0;
        w.end_ino = 0;
    }
    if sync && let Err(e) = w.conn.execute_batch("PRAGMA synchronous=NORMAL") {
        tracing::warn!("volume: PRAGMA synchronous=NORMAL: {e}");
    }
    answer(batch, committed);
}

/// Answers every job of a batch. An answer that panics (a bug in a completion) is logged and
/// the others are still answered: the writer, and with it the mount, goes on. Its own
/// request was answered EIO when its `Reply` was dropped in the unwinding.
fn answer(batch: Vec<Box<dyn Job>>, committed: Result<(), Errno>) {
    for job in batch {
        if let Err(panic) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.finish(committed)))
        {
            tracing::error!(
                "volume: answering a metadata change panicked ({})",
                panic_text(&*panic)
            );
        }
    }
}

/// A panic's message, as far as it is text.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

impl MetaStore for SqliteStore {
    fn lookup(&self, queue: usize, parent: u64, name: &[u8]) -> Result<InodeRec, Errno> {
        let conn = self.reader(queue);
        conn.prepare_cached(LOOKUP_SQL)
            .and_then(|mut s| {
                s.query_row(params![parent as i64, name], |r| attr_from_row(r, 0))
                    .optional()
            })
            .map_err(db)?
            .ok_or(libc::ENOENT)
    }

    fn getattr(&self, queue: usize, ino: u64) -> Result<InodeRec, Errno> {
        read_attr(&self.reader(queue), ino)
    }

    fn readdir(&self, queue: usize, dir: u64) -> Result<Vec<DirItem>, Errno> {
        let conn = self.reader(queue);
        conn.prepare_cached(READDIR_SQL)
            .and_then(|mut s| {
                s.query_map([dir as i64], |r| {
                    Ok(DirItem {
                        name: r.get(0)?,
                        attr: attr_from_row(r, 1)?,
                    })
                })?
                .collect()
            })
            .map_err(db)
    }

    fn readlink(&self, queue: usize, ino: u64) -> Result<Vec<u8>, Errno> {
        let conn = self.reader(queue);
        conn.prepare_cached("SELECT target FROM symlinks WHERE ino = ?")
            .and_then(|mut s| s.query_row([ino as i64], |r| r.get(0)).optional())
            .map_err(db)?
            .ok_or(libc::EINVAL)
    }

    fn getxattr(&self, queue: usize, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let conn = self.reader(queue);
        conn.prepare_cached("SELECT value FROM xattrs WHERE ino = ? AND name = ?")
            .and_then(|mut s| {
                s.query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()
            })
            .map_err(db)?
            .ok_or(libc::ENODATA)
    }

    fn listxattr(&self, queue: usize, ino: u64) -> Result<Vec<Vec<u8>>, Errno> {
        let conn = self.reader(queue);
        conn.prepare_cached("SELECT name FROM xattrs WHERE ino = ? ORDER BY name")
            .and_then(|mut s| s.query_map([ino as i64], |r| r.get(0))?.collect())
            .map_err(db)
    }

    fn load_file(&self, queue: usize, ino: u64) -> Result<FileRec, Errno> {
        let conn = self.reader(queue);
        conn.execute_batch("BEGIN").map_err(db)?;
        let result = (|| {
            let attr = read_attr(&conn, ino)?;
            let inline: Option<Vec<u8>> = conn
                .prepare_cached("SELECT inline_data FROM inodes WHERE ino = ?")
                .and_then(|mut s| s.query_row([ino as i64], |r| r.get(0)))
                .map_err(db)?;
            let chunks = conn
                .prepare_cached(
                    "SELECT idx, block, len, crc FROM chunks WHERE ino = ? ORDER BY idx",
                )
                .and_then(|mut s| {
                    s.query_map([ino as i64], |r| {
                        Ok(ChunkRec {
                            idx: r.get::<_, i64>(0)? as u64,
                            block: r.get::<_, i64>(1)? as u64,
                            len: r.get::<_, i64>(2)? as u64,
                            crc: r.get::<_, i64>(3)? as u32,
                        })
                    })?
                    .collect()
                })
                .map_err(db)?;
            Ok(FileRec {
                attr,
                inline,
                chunks,
            })
        })();
        let _ = conn.execute_batch("COMMIT");
        result
    }

    fn usage(&self) -> Result<Usage, Errno> {
        let conn = self.reader(0);
        conn.query_row(
            "SELECT count(*), coalesce(sum(size), 0) FROM inodes",
            [],
            |r| {
                Ok(Usage {
                    inodes: r.get::<_, i64>(0)? as u64,
                    bytes: r.get::<_, i64>(1)? as u64,
                })
            },
        )
        .map_err(db)
    }

    fn create(&self, node: NewNode, done: Done<InodeRec>) {
        self.submit(
            false,
            move |w| {
                let dir = node.mode & libc::S_IFMT == libc::S_IFDIR;
                let ino = w.alloc_ino();
                // No name: an O_TMPFILE, an orphan from birth (a later link names it).
                let unnamed = node.name.is_empty();
                let (parent_mode, parent_gid) = if unnamed {
                    w.conn
                        .prepare_cached("INSERT INTO orphans (ino, session) VALUES (?, ?)")
                        .and_then(|mut s| s.execute(params![ino as i64, w.session as i64]))
                        .map_err(db)?;
                    let parent = w.attr(node.parent)?;
                    (parent.mode, parent.gid)
                } else {
                    w.insert_entry(node.parent, &node.name, ino, node.mode)?;
                    w.touch_dir_returning(node.parent, node.now_ns, dir as i64)?
                };
                if parent_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(libc::ENOTDIR);
                }
                // A set-group-ID directory hands down its group, and to directories the bit.
                let (mut mode, mut gid) = (node.mode, node.gid);
                if parent_mode & libc::S_ISGID != 0 {
                    gid = parent_gid;
                    if dir {
                        mode |= libc::S_ISGID;
                    }
                }
                let attr = InodeRec {
                    ino,
                    mode,
                    uid: node.uid,
                    gid,
                    rdev: node.rdev,
                    nlink: if unnamed {
                        0
                    } else if dir {
                        2
                    } else {
                        1
                    },
                    size: node.target.as_ref().map_or(0, |t| t.len() as u64),
                    atime_ns: node.now_ns,
                    mtime_ns: node.now_ns,
                    ctime_ns: node.now_ns,
                    parent: node.parent,
                };
                insert_inode(&w.conn, &attr, None).map_err(db)?;
                if let Some(target) = &node.target {
                    w.conn
                        .prepare_cached("INSERT INTO symlinks (ino, target) VALUES (?, ?)")
                        .and_then(|mut s| s.execute(params![ino as i64, target]))
                        .map_err(db)?;
                }
                Ok(attr)
            },
            done,
        )
    }

    fn link(&self, ino: u64, parent: u64, name: Vec<u8>, now_ns: i64, done: Done<InodeRec>) {
        self.submit(
            false,
            move |w| {
                let attr = w.attr(ino)?;
                if attr.is_dir() {
                    return Err(libc::EPERM);
                }
                w.insert_entry(parent, &name, ino, attr.mode)?;
                w.touch_dir(parent, now_ns, 0)?;
                w.conn
                    .prepare_cached(
                        "UPDATE inodes SET nlink = nlink + 1, ctime_ns = ? WHERE ino = ?",
                    )
                    .and_then(|mut s| s.execute(params![now_ns, ino as i64]))
                    .map_err(db)?;
                if attr.nlink == 0 {
                    w.conn
                        .execute("DELETE FROM orphans WHERE ino = ?", [ino as i64])
                        .map_err(db)?;
                }
                w.attr(ino)
            },
            done,
        )
    }

    fn remove(
        &self,
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        self.submit(
            false,
            move |w| {
                let (ino, mode, nlink) = w.entry(parent, &name)?.ok_or(libc::ENOENT)?;
                let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
                match (dir, is_dir) {
                    (true, false) => return Err(libc::ENOTDIR),
                    (false, true) => return Err(libc::EISDIR),
                    _ => {}
                }
                if is_dir && !w.is_empty_dir(ino)? {
                    return Err(libc::ENOTEMPTY);
                }
                w.delete_entry(parent, &name)?;
                w.touch_dir(parent, now_ns, -(is_dir as i64))?;
                if is_dir {
                    w.free_inode(ino, now_ns)?;
                    Ok(Removed {
                        ino,
                        ..Default::default()
                    })
                } else {
                    w.drop_link(ino, nlink, now_ns, &is_open)
                }
            },
            done,
        )
    }

    fn rename(
        &self,
        parent: u64,
        name: Vec<u8>,
        newparent: u64,
        newname: Vec<u8>,
        flags: u32,
        now_ns: i64,
        is_open: IsOpen,
        done: Done<Renamed>,
    ) {
        self.submit(
            false,
            move |w| {
                let (src, src_mode, _) = w.entry(parent, &name)?.ok_or(libc::ENOENT)?;
                let dst = w.entry(newparent, &newname)?;
                let src_dir = src_mode & libc::S_IFMT == libc::S_IFDIR;
                let mut renamed = Renamed::default();
                if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
                    return Err(libc::EEXIST);
                }
                if flags & libc::RENAME_EXCHANGE != 0 {
                    let (dst, dst_mode, _) = dst.ok_or(libc::ENOENT)?;
                    let dst_dir = dst_mode & libc::S_IFMT == libc::S_IFDIR;
                    for (p, n, ino, mode) in [(parent, &name, dst, dst_mode), (newparent, &newname, src, src_mode)] {
                        w.conn
                            .prepare_cached("UPDATE entries SET ino = ?, kind = ? WHERE parent = ? AND name = ?")
                            .and_then(|mut s| s.execute(params![ino as i64, kind_of(mode), p as i64, n]))
                            .map_err(db)?;
                    }
                    if parent != newparent {
                        for (ino, is_dir, now_in) in [(src, src_dir, newparent), (dst, dst_dir, parent)] {
                            if is_dir {
                                w.conn
                                    .prepare_cached("UPDATE inodes SET parent = ? WHERE ino = ?")
                                    .and_then(|mut s| s.execute(params![now_in as i64, ino as i64]))
                                    .map_err(db)?;
                            }
                        }
                        let delta = src_dir as i64 - dst_dir as i64;
                        w.touch_dir(parent, now_ns, -delta)?;
                        w.touch_dir(newparent, now_ns, delta)?;
                    } else {
                        w.touch_dir(parent, now_ns, 0)?;
                    }
                    for ino in [src, dst] {
                        w.conn
                            .prepare_cached("UPDATE inodes SET ctime_ns = ? WHERE ino = ?")
                            .and_then(|mut s| s.execute(params![now_ns, ino as i64]))
                            .map_err(db)?;
                    }
                    return Ok(renamed);
                }
                if let Some((dst, dst_mode, dst_nlink)) = dst {
                    if dst == src {
                        return Ok(renamed);
                    }
                    let dst_dir = dst_mode & libc::S_IFMT == libc::S_IFDIR;
                    match (src_dir, dst_dir) {
                        (true, false) => return Err(libc::ENOTDIR),
                        (false, true) => return Err(libc::EISDIR),
                        _ => {}
                    }
                    if dst_dir && !w.is_empty_dir(dst)? {
                        return Err(libc::ENOTEMPTY);
                    }
                    w.delete_entry(newparent, &newname)?;
                    if dst_dir {
                        w.touch_dir(newparent, now_ns, -1)?;
                        w.free_inode(dst, now_ns)?;
                        renamed.replaced = Some(Removed { ino: dst, ..Default::default() });
                    } else {
                        renamed.replaced = Some(w.drop_link(dst, dst_nlink, now_ns, &is_open)?);
                    }
                }
                w.delete_entry(parent, &name)?;
                w.insert_entry(newparent, &newname, src, src_mode)?;
                let moved_dir = src_dir && parent != newparent;
                w.touch_dir(parent, now_ns, -(moved_dir as i64))?;
                if parent != newparent {
                    w.touch_dir(newparent, now_ns, moved_dir as i64)?;
                }
                w.conn
                    .prepare_cached("UPDATE inodes SET ctime_ns = ?, parent = CASE WHEN ? THEN ? ELSE parent END WHERE ino = ?")
                    .and_then(|mut s| s.execute(params![now_ns, src_dir, newparent as i64, src as i64]))
                    .map_err(db)?;
                Ok(renamed)
            },
            done,
        )
    }

    fn setattr(&self, ino: u64, c: AttrChange, done: Done<InodeRec>) {
        self.submit(
            false,
            move |w| {
                let n = w
                    .conn
                    .prepare_cached(
                        "UPDATE inodes SET mode = coalesce(?, mode), uid = coalesce(?, uid), gid = coalesce(?, gid),
                         atime_ns = coalesce(?, atime_ns), mtime_ns = coalesce(?, mtime_ns), ctime_ns = ? WHERE ino = ?",
                    )
                    .and_then(|mut s| {
                        s.execute(params![
                            c.mode.map(|m| m as i64),
                            c.uid.map(|u| u as i64),
                            c.gid.map(|g| g as i64),
                            c.atime_ns,
                            c.mtime_ns,
                            c.ctime_ns,
                            ino as i64
                        ])
                    })
                    .map_err(db)?;
                if n == 0 {
                    return Err(libc::ENOENT);
                }
                w.attr(ino)
            },
            done,
        )
    }

    fn update_data(&self, u: DataUpdate, done: Done<Vec<u64>>) {
        self.submit(
            false,
            move |w| {
                let n = w
                    .conn
                    .prepare_cached(
                        "UPDATE inodes SET size = ?, mtime_ns = ?, ctime_ns = ?, inline_data = ? WHERE ino = ?",
                    )
                    .and_then(|mut s| s.execute(params![u.size as i64, u.mtime_ns, u.ctime_ns, u.inline, u.ino as i64]))
                    .map_err(db)?;
                if n == 0 {
                    return Err(libc::ENOENT);
                }
                let mut released = Vec::new();
                if let Some(from) = u.drop_from {
                    released.extend(w.release_chunks(u.ino, from, None, u.ctime_ns)?);
                }
                if let Some((idx, len)) = u.trim {
                    w.conn
                        .prepare_cached("UPDATE chunks SET len = min(len, ?) WHERE ino = ? AND idx = ?")
                        .and_then(|mut s| s.execute(params![len as i64, u.ino as i64, idx as i64]))
                        .map_err(db)?;
                }
                for idx in &u.holes {
                    released.extend(w.release_chunks(u.ino, 0, Some(*idx), u.ctime_ns)?);
                }
                for c in &u.set {
                    released.extend(w.release_chunks(u.ino, 0, Some(c.idx), u.ctime_ns)?);
                    w.conn
                        .prepare_cached("INSERT INTO chunks (ino, idx, block, len, crc) VALUES (?, ?, ?, ?, ?)")
                        .and_then(|mut s| {
                            s.execute(params![u.ino as i64, c.idx as i64, c.block as i64, c.len as i64, c.crc as i64])
                        })
                        .map_err(db)?;
                }
                Ok(released)
            },
            done,
        )
    }

    fn setxattr(&self, ino: u64, name: Vec<u8>, value: Vec<u8>, flags: u32, done: Done<()>) {
        self.submit(
            false,
            move |w| {
                let exists: Option<i64> = w
                    .conn
                    .prepare_cached("SELECT 1 FROM xattrs WHERE ino = ? AND name = ?")
                    .and_then(|mut s| {
                        s.query_row(params![ino as i64, &name], |r| r.get(0))
                            .optional()
                    })
                    .map_err(db)?;
                if flags & libc::XATTR_CREATE as u32 != 0 && exists.is_some() {
                    return Err(libc::EEXIST);
                }
                if flags & libc::XATTR_REPLACE as u32 != 0 && exists.is_none() {
                    return Err(libc::ENODATA);
                }
                w.conn
                    .prepare_cached(
                        "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)
                         ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
                    )
                    .and_then(|mut s| s.execute(params![ino as i64, &name, &value]))
                    .map_err(db)?;
                Ok(())
            },
            done,
        )
    }

    fn removexattr(&self, ino: u64, name: Vec<u8>, done: Done<()>) {
        self.submit(
            false,
            move |w| {
                let n = w
                    .conn
                    .prepare_cached("DELETE FROM xattrs WHERE ino = ? AND name = ?")
                    .and_then(|mut s| s.execute(params![ino as i64, &name]))
                    .map_err(db)?;
                if n == 0 { Err(libc::ENODATA) } else { Ok(()) }
            },
            done,
        )
    }

    fn free_orphan(&self, ino: u64, done: Done<Vec<u64>>) {
        self.submit(
            false,
            move |w| {
                let nlink: Option<i64> = w
                    .conn
                    .prepare_cached("SELECT nlink FROM inodes WHERE ino = ?")
                    .and_then(|mut s| s.query_row([ino as i64], |r| r.get(0)).optional())
                    .map_err(db)?;
                match nlink {
                    // Linked again meanwhile (or never orphaned): nothing to free.
                    Some(n) if n > 0 => Ok(Vec::new()),
                    None => Ok(Vec::new()),
                    Some(_) => w.free_inode(ino, crate::now_ns()),
                }
            },
            done,
        )
    }

    fn sync(&self, done: Done<()>) {
        // An empty transaction writes no WAL frame, so its COMMIT under synchronous=FULL
        // fsyncs nothing. This one rewrites the session's heartbeat: its frames follow those
        // of every earlier commit in the WAL, and the fsync of the WAL that FULL does at this
        // commit makes all of them durable. Anything acknowledged before this job was queued
        // was committed by an earlier batch or is in this one.
        let session = self.session as i64;
        self.submit(
            true,
            move |w| {
                w.conn
                    .prepare_cached("UPDATE sessions SET heartbeat_ns = ? WHERE id = ?")
                    .and_then(|mut s| s.execute(params![crate::now_ns(), session]))
                    .map_err(db)?;
                Ok(())
            },
            done,
        )
    }

    fn forget_blocks(&self, blocks: Vec<u64>, done: Done<()>) {
        self.submit(
            false,
            move |w| {
                for b in &blocks {
                    w.conn
                        .prepare_cached("DELETE FROM gc_blocks WHERE block = ?")
                        .and_then(|mut s| s.execute([*b as i64]))
                        .map_err(db)?;
                }
                Ok(())
            },
            done,
        )
    }

    fn blocks_between(&self, lo: u64, hi: u64) -> Result<Vec<u64>, Errno> {
        let conn = self.reader(0);
        conn.prepare_cached("SELECT block FROM chunks WHERE block >= ? AND block < ?")
            .and_then(|mut s| {
                s.query_map(params![lo as i64, hi as i64], |r| {
                    r.get::<_, i64>(0).map(|b| b as u64)
                })?
                .collect()
            })
            .map_err(db)
    }

    fn crashed_sessions(&self) -> Vec<u64> {
        self.crashed.clone()
    }

    fn pending_gc(&self) -> Result<Vec<u64>, Errno> {
        let conn = self.reader(0);
        conn.prepare_cached("SELECT block FROM gc_blocks")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, i64>(0).map(|b| b as u64))?
                    .collect()
            })
            .map_err(db)
    }

    fn heartbeat(&self, now_ns: i64, done: Done<()>) {
        let session = self.session as i64;
        self.submit(
            false,
            move |w| {
                w.conn
                    .execute(
                        "UPDATE sessions SET heartbeat_ns = ? WHERE id = ?",
                        params![now_ns, session],
                    )
                    .map_err(db)?;
                Ok(())
            },
            done,
        )
    }

    fn close(&self) {
        let checkpointer = self
            .checkpointer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((stop, handle)) = checkpointer {
            let _ = stop.send(());
            let _ = handle.join();
        }
        let _ = self.jobs.send(Msg::Close);
        let _ = self.wake.send(());
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    fn touch_atime(&self, ino: u64, atime_ns: i64, done: Done<()>) {
        self.submit(
            false,
            move |w| {
                w.conn
                    .prepare_cached("UPDATE inodes SET atime_ns = ? WHERE ino = ?")
                    .and_then(|mut s| s.execute(params![atime_ns, ino as i64]))
                    .map_err(db)?;
                Ok(())
            },
            done,
        )
    }

    fn fileattr_flags(&self) -> Result<Vec<(u64, u32)>, Errno> {
        let conn = self.reader(0);
        conn.prepare_cached("SELECT ino, value FROM xattrs WHERE name = ?")
            .and_then(|mut s| {
                s.query_map(params![FILEATTR_XATTR], |r| {
                    let value: Vec<u8> = r.get(1)?;
                    let flags = value
                        .first_chunk::<4>()
                        .map_or(0, |b| u32::from_le_bytes(*b));
                    Ok((r.get::<_, i64>(0)? as u64, flags))
                })?
                .collect()
            })
            .map_err(db)
    }

    fn set_fileattr_flags(&self, ino: u64, flags: u32, ctime_ns: i64, done: Done<()>) {
        self.submit(
            false,
            move |w| {
                let n = w
                    .conn
                    .prepare_cached("UPDATE inodes SET ctime_ns = ? WHERE ino = ?")
                    .and_then(|mut s| s.execute(params![ctime_ns, ino as i64]))
                    .map_err(db)?;
                if n == 0 {
                    return Err(libc::ENOENT);
                }
                let written = if flags == 0 {
                    w.conn
                        .prepare_cached("DELETE FROM xattrs WHERE ino = ? AND name = ?")
                        .and_then(|mut s| s.execute(params![ino as i64, FILEATTR_XATTR]))
                } else {
                    w.conn
                        .prepare_cached(
                            "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)
                             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
                        )
                        .and_then(|mut s| {
                            s.execute(params![
                                ino as i64,
                                FILEATTR_XATTR,
                                flags.to_le_bytes().as_slice()
                            ])
                        })
                };
                written.map_err(db)?;
                Ok(())
            },
            done,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{ROOT_INO, wait};
    use crate::volume;

    /// A formatted volume in a temp dir, opened as a mount would; removed when dropped.
    struct Fixture {
        dir: std::path::PathBuf,
        db: std::path::PathBuf,
        store: SqliteStore,
    }

    impl Fixture {
        fn new(tag: &str) -> Fixture {
            let dir =
                std::env::temp_dir().join(format!("lanefs-sqlite-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let db = dir.join("v.db");
            volume::format(&db, &dir.join("data"), false).unwrap();
            let store = SqliteStore::open(&db, "test", "/none", 1).unwrap();
            Fixture { dir, db, store }
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.store.close();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A panic in a change or in its answer costs that change (EIO), not the writer: the
    /// changes around it and after it are committed and answered.
    #[test]
    fn a_panicking_change_or_answer_leaves_the_writer_running() {
        let f = Fixture::new("panic");
        let beat = |store: &SqliteStore| {
            wait(|done| {
                store.submit(
                    false,
                    |w| {
                        w.conn
                            .execute("UPDATE sessions SET heartbeat_ns = 7", [])
                            .map_err(db)?;
                        Ok(())
                    },
                    done,
                )
            })
        };
        let failed = wait(|done: Done<()>| {
            f.store.submit(
                false,
                |_| -> Result<(), Errno> { panic!("a bug in a change") },
                done,
            )
        });
        assert_eq!(failed, Err(libc::EIO));
        assert_eq!(beat(&f.store), Ok(()));
        let (tx, rx) = std::sync::mpsc::channel();
        f.store.submit(
            false,
            |_| Ok(()),
            Box::new(|_: Result<(), Errno>| panic!("a bug in an answer")),
        );
        f.store.submit(
            false,
            |_| Ok(()),
            Box::new(move |r: Result<(), Errno>| {
                let _ = tx.send(r);
            }),
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(Ok(())));
        assert_eq!(
            beat(&f.store),
            Ok(()),
            "the writer died with the answer's panic"
        );
    }

    /// After a sync, no page of the WAL is only in the page cache: the commits before it are
    /// on the disk.
    #[test]
    fn a_sync_writes_the_wal_to_the_disk() {
        let f = Fixture::new("walsync");
        let mut wal = f.db.clone().into_os_string();
        wal.push("-wal");
        let wal = std::path::PathBuf::from(wal);
        let unwritten = || crate::testing::unwritten_pages(&wal);
        let change = |i: u8| {
            wait(|done| {
                f.store
                    .setxattr(ROOT_INO, b"user.x".to_vec(), vec![i; 100], 0, done)
            })
            .unwrap()
        };
        // A change committed with synchronous=NORMAL leaves WAL pages to write (the
        // checkpointer may have written them meanwhile: then once more).
        let mut i = 0;
        while {
            change(i);
            i += 1;
            unwritten() == 0 && i < 10
        } {}
        assert!(
            unwritten() > 0,
            "a commit left nothing to write: this test shows nothing"
        );
        wait(|done| f.store.sync(done)).unwrap();
        assert_eq!(unwritten(), 0, "the WAL is not on the disk after a sync");
    }

    /// A sync must commit something: SQLite fsyncs the WAL at a FULL commit only when the
    /// commit writes frames, and another connection's `data_version` changes exactly when a
    /// commit wrote pages.
    #[test]
    fn sync_commits_a_frame_so_the_wal_is_fsynced() {
        let f = Fixture::new("sync");
        let other = connect(&f.db, false).unwrap();
        let version = |c: &Connection| -> i64 {
            c.query_row("PRAGMA data_version", [], |r| r.get(0))
                .unwrap()
        };
        // The first batch of a session takes a range of inode numbers (a write of its own).
        wait(|done| f.store.sync(done)).unwrap();
        let before = version(&other);
        wait(|done| f.store.sync(done)).unwrap();
        assert_ne!(
            version(&other),
            before,
            "a sync committed no frame: nothing was fsynced"
        );
    }
}
