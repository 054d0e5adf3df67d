//! `SqlStore`: the MetaStore on an SQL engine, written once for SQLite and PostgreSQL.
//! Reads run on the caller's thread on a read connection of its own queue; every change is
//! queued to one committer, which joins whatever is queued into one transaction (group
//! commit) and answers each change after the commit. What differs between the engines (how
//! a transaction starts and ends, what a failure means, reconnecting) is [`Conn`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::intent::{self, Intent, IntentLog, Watermark};
use crate::meta::*;
use crate::ops::{self, Writer};
use crate::sql::{DbError, Tx, args};

/// Changes joined into one transaction at most.
pub const BATCH_OPS_MAX: usize = 256;
/// Runs of one batch when the engine gives up on its transaction (deadlock, serialization
/// failure) or the connection is lost before COMMIT; then its changes get EIO.
pub const BATCH_TRIES_MAX: u32 = 10;
/// The wait before a batch's next run grows by this much each time (10 tries: ~0.5 s).
pub const BATCH_RETRY_BACKOFF_STEP: Duration = Duration::from_millis(10);
/// How long the writer thread lets changes that nobody waits for (early creates, removals,
/// data and attribute changes) gather before it commits them, unless a waiting caller wakes
/// it sooner. A create loop answered early queues one change per ~100 µs on this VM: without
/// the wait the writer commits them one or two at a time, one transaction (and on SQLite one
/// WAL append) each, and takes the CPU the loop needs; with it a batch holds a few dozen.
/// Short beside the commit of a batch (about 1 ms on SQLite, more on PostgreSQL), and fsync,
/// sync and every synchronous change skip it.
pub const BACKGROUND_GATHER: Duration = Duration::from_micros(500);
/// Changes answered before their commit wait at most about this long for it, at the rate
/// the database commits them (besides `async_backlog` in number): a slow database holds a
/// backlog of seconds, not of minutes. On a shared volume another mount that recalls a
/// lease waits for the holder's backlog before the holder lets go, and a recalled lease is
/// not renewed: it expires `ops::LEASE_TTL` (10 s) after its last renewal, and a holder
/// whose backlog took longer would lose it with changes answered under it still queued.
/// Under `leases::LEASE_MARGIN` (3 s), so that what was answered just before a lease's
/// margin began commits before the lease expires.
pub const BACKLOG_DRAIN_MAX: Duration = Duration::from_secs(2);
/// A change that finds the backlog full waits this long at most for room in it (a change
/// to finish, at the database's pace), then for its own commit: a database that finishes
/// none in this long is stuck, not slow. Turning the change synchronous at once instead
/// queued it behind the whole backlog (two seconds' worth), and a loop of creates that
/// filled the backlog stalled for that long, again and again.
const ROOM_WAIT_MAX: Duration = Duration::from_secs(1);
/// A batch of this many changes measures the database's commit rate (a smaller one, or a
/// heartbeat alone on a distant database, says more about how few changes came, or about
/// the round trip, than about how many the database commits a second).
const RATE_SAMPLE_OPS_MIN: usize = 16;
/// The backlog before the rate is measured (the first batches of a mount), and the least
/// the rate allows (room for batches that measure it).
const UNMEASURED_BACKLOG_MAX: u64 = 4 * BATCH_OPS_MAX as u64;
const MEASURED_BACKLOG_MIN: u64 = 4 * RATE_SAMPLE_OPS_MIN as u64;

/// A connection of one engine, as the committer and the readers use it.
pub trait Conn: Tx + Send + 'static {
    /// Starts a write transaction; `sync`: its commit must be durable when it returns.
    fn begin(&mut self, sync: bool) -> Result<(), DbError>;
    fn commit(&mut self, sync: bool) -> Result<(), DbError>;
    fn rollback(&mut self);
    /// Runs statements with no arguments and no rows (savepoints).
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;
    /// Starts and ends a read-only snapshot (load_file's three statements).
    fn begin_read(&mut self) -> Result<(), DbError>;
    fn end_read(&mut self);
    /// A retryable or connection failure that a statement of the current transaction hit
    /// (an operation turns every failure into its errno; the committer asks here whether
    /// the whole transaction should run again). Cleared by the call.
    fn take_failure(&mut self) -> Option<DbError>;
    /// Makes the transaction's commit require a row of `sql` (a query) without waiting for
    /// it now: an engine with round trips sends it ahead of the transaction's next statement
    /// (and, with no statement before the COMMIT, on its own before it) and, when it found
    /// no row, fails that statement and the transaction, which `take_row_missing` then
    /// says. An embedded engine asks at once: `Ok(false)` when there is no row.
    fn require_row(
        &mut self,
        sql: &'static str,
        args: &[crate::sql::Arg<'_>],
    ) -> Result<bool, DbError> {
        self.query_opt(sql, args).map(|row| row.is_some())
    }
    /// Sends a `require_row` query still waiting to go (and what waits with it), for its
    /// answer before the COMMIT (which refuses to go with one pending). A failure here is
    /// one before the COMMIT was sent: a lost connection may be retried.
    fn send_required(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    /// Whether a `require_row` found no row since the transaction began. Cleared by the call.
    fn take_row_missing(&mut self) -> bool {
        false
    }
    /// Connects again after a lost connection, waiting a bounded time; false if it could not.
    fn reconnect(&mut self) -> bool;
    /// The database server's clock now (ns since the epoch), where the server is another
    /// machine whose clock the mounts of a shared volume agree on; None for an embedded one.
    fn server_now_ns(&mut self) -> Option<Result<i64, DbError>>;
}

/// The clock a mount judges sessions and leases by: the database server's, as read at the
/// mount and again at each heartbeat, carried between readings by this machine's monotonic
/// clock. Heartbeats and lease expiries are written by one mount and judged by others; by
/// each one's own wall clock, a mount whose clock is ahead by more than `LEASE_TTL` would
/// take a live lease without a recall, and one ahead by more than the session expiry would
/// end live sessions (their mounts fenced, every change EIO). By the server's clock they
/// agree to within a round trip, and a step of this machine's wall clock changes nothing.
/// An embedded database (SQLite: one mount) keeps this machine's clock.
pub struct VolumeClock {
    base: std::time::Instant,
    /// Volume time at `base`: what is added to the monotonic ns since `base`.
    offset_ns: AtomicI64,
}

/// A later reading of the server's clock taken over a longer round trip than this is not
/// used: its error (up to half the round trip) would eat into `leases::LEASE_MARGIN`. The
/// first, at the mount, is used whatever its round trip: this machine's clock, the only
/// other choice, may be off by any amount.
const CLOCK_READING_ROUND_TRIP_MAX: Duration = Duration::from_millis(200);

impl VolumeClock {
    /// This machine's wall clock, from now on carried by its monotonic clock.
    pub fn local() -> VolumeClock {
        VolumeClock {
            base: std::time::Instant::now(),
            offset_ns: AtomicI64::new(crate::now_ns()),
        }
    }

    /// The server's clock of `conn` where it has one, else this machine's.
    pub fn of<C: Conn>(conn: &mut C) -> Result<VolumeClock, DbError> {
        let clock = VolumeClock::local();
        clock.read_server(conn, Duration::MAX)?;
        Ok(clock)
    }

    pub fn now_ns(&self) -> i64 {
        self.offset_ns.load(Ordering::Relaxed) + self.base.elapsed().as_nanos() as i64
    }

    /// Reads the server's clock again; a reading over a round trip above `round_trip_max`
    /// is not used.
    fn read_server<C: Conn>(&self, conn: &mut C, round_trip_max: Duration) -> Result<(), DbError> {
        let before = self.base.elapsed();
        let Some(server_ns) = conn.server_now_ns().transpose()? else {
            return Ok(());
        };
        let after = self.base.elapsed();
        if after - before <= round_trip_max {
            let mid = (before + (after - before) / 2).as_nanos() as i64;
            self.offset_ns.store(server_ns - mid, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A change waiting for the committer.
trait Job<C: Conn>: Send {
    /// Runs inside the batch's transaction, in a savepoint of its own when `savepoint` (a
    /// batch of one needs none: its failure rolls back the whole transaction); whether it
    /// succeeded.
    fn apply(&mut self, w: &mut Writer<C>, savepoint: bool) -> bool;
    /// After the commit (`Ok`) or its failure (the errno): answers.
    fn finish(self: Box<Self>, committed: Result<(), Errno>);
    fn sync(&self) -> bool;
    /// Its number in the intent log (0: not logged).
    fn logged(&self) -> u64;
}

struct Change<T, F> {
    /// Run again when the batch's transaction is.
    op: F,
    result: Option<Result<T, Errno>>,
    done: Done<T>,
    sync: bool,
    logged: u64,
}

impl<T, F> Change<T, F> {
    fn boxed(op: F, done: Done<T>, sync: bool) -> Box<Self> {
        Box::new(Change {
            op,
            result: None,
            done,
            sync,
            logged: 0,
        })
    }
}

impl<C: Conn, T: Send, F: FnMut(&mut Writer<C>) -> Result<T, Errno> + Send> Job<C>
    for Change<T, F>
{
    fn apply(&mut self, w: &mut Writer<C>, savepoint: bool) -> bool {
        if savepoint && let Err(e) = w.conn.batch("SAVEPOINT op") {
            self.result = Some(Err(e.into()));
            return false;
        }
        let attr_events = w.attr_events.len();
        // A panic in an operation (a bug) must not take the committer, and with it every
        // later change of the mount, down: the operation's savepoint is rolled back and it
        // gets EIO.
        let op = &mut self.op;
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
        let ok = result.is_ok();
        if !savepoint {
            self.result = Some(result);
            return ok;
        }
        // RELEASE also sends what the change left to go later (`Tx::execute_later`): its
        // failure is the change's, and its savepoint is rolled back as for any other.
        let released = match result {
            Ok(v) => w.conn.batch("RELEASE op").map(|()| v).map_err(Errno::from),
            Err(e) => Err(e),
        };
        let result = match released {
            Ok(v) => Ok(v),
            Err(e) => {
                w.truncate_attr_events(attr_events);
                match w.conn.batch("ROLLBACK TO op; RELEASE op") {
                    Ok(()) => Err(e),
                    Err(e) => Err(e.into()),
                }
            }
        };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
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

    fn logged(&self) -> u64 {
        self.logged
    }
}

enum Msg<C> {
    Job(Box<dyn Job<C>>),
    /// End the session and stop the writer.
    Close,
}

/// A background thread and the sender whose message (or end) stops it.
pub type Stoppable = (Sender<()>, JoinHandle<()>);

/// Directories' attributes as this mount's own commits left them, on a shared volume. The
/// kernel drops a directory's attributes at each create or remove in it and asks for them
/// again before the next (its permission check), a round trip to the database each time;
/// the create's own UPDATE of the directory returned them. An entry lives no longer than
/// the kernel may cache attributes (`ttl`, the mount's attribute timeout) and goes at once
/// when this mount changes the inode otherwise or when the change log shows another
/// mount's change to it: the bound on staleness is the kernel's own.
pub struct RecentDirs {
    ttl: Duration,
    /// By inode number modulo the shard count; each mutex is a leaf, held for one map
    /// operation.
    shards: Vec<Mutex<HashMap<u64, (InodeRec, Instant)>>>,
    /// How many times the change log dropped an entry: a batch that saw it move between
    /// its start and its publication keeps nothing (another mount's change read meanwhile
    /// may be newer than what the batch's statements returned).
    foreign_changes: AtomicU64,
}

impl RecentDirs {
    const SHARDS: usize = 16;

    pub fn new(ttl: Duration) -> RecentDirs {
        RecentDirs {
            ttl,
            shards: (0..Self::SHARDS).map(|_| Mutex::default()).collect(),
            foreign_changes: AtomicU64::new(0),
        }
    }

    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, (InodeRec, Instant)>> {
        self.shards[ino as usize % Self::SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, ino: u64) -> Option<InodeRec> {
        let mut shard = self.shard(ino);
        match shard.get(&ino) {
            Some((rec, at)) if at.elapsed() < self.ttl => Some(rec.clone()),
            Some(_) => {
                shard.remove(&ino);
                None
            }
            None => None,
        }
    }

    /// Read before a batch runs, for `publish`.
    fn foreign_changes(&self) -> u64 {
        self.foreign_changes.load(Ordering::Acquire)
    }

    /// A committed batch's attribute events, in order (see `Writer::attr_events`); its
    /// records only if no other mount's change was read since `foreign_changes_before`.
    fn publish(
        &self,
        events: impl Iterator<Item = (u64, Option<InodeRec>)>,
        foreign_changes_before: u64,
    ) {
        let keep = self.foreign_changes() == foreign_changes_before;
        let now = Instant::now();
        for (ino, rec) in events {
            let mut shard = self.shard(ino);
            match rec {
                Some(rec) if keep => shard.insert(ino, (rec, now)),
                _ => shard.remove(&ino),
            };
        }
    }

    /// Another mount changed `ino` (the change log says).
    fn forget_foreign(&self, ino: u64) {
        self.foreign_changes.fetch_add(1, Ordering::AcqRel);
        self.shard(ino).remove(&ino);
    }
}

/// What an engine does besides the shared logic.
pub struct EngineParts<C: Conn> {
    /// The committer's connection and session, the session already registered.
    pub writer: Writer<C>,
    pub readers: Vec<C>,
    /// Sessions that ended without unmounting, found (and cleaned up) at the start.
    pub crashed: Vec<u64>,
    /// What the session's heartbeat, its expiry of others and leases are timed by.
    pub clock: VolumeClock,
    /// A background thread of the engine's (SQLite's checkpointer), stopped at close.
    pub background: Option<Stoppable>,
    /// Whether a heartbeat also ends other sessions whose heartbeat is older than this
    /// (a volume shared by many mounts); None where one mount holds the volume.
    pub session_expiry: Option<Duration>,
    /// Runs after the session's row is gone, on the committer's connection (SQLite folds its
    /// WAL into the database there).
    pub at_close: fn(&mut C),
    /// Directories' attributes kept from this mount's commits for this long (a shared
    /// volume with an attribute timeout, see `RecentDirs`); None: not kept.
    pub recent_dir_ttl: Option<Duration>,
    /// Set while the database is found gone (a reconnect waited its longest in vain),
    /// cleared by the next connection made; never set for an embedded one.
    pub database_gone: Arc<AtomicBool>,
}

pub struct SqlStore<C: Conn> {
    /// Read connections. Each mutex protects one connection (neither engine's connection is
    /// Sync); a queue takes its own (`queue % readers`) or any idle one. Leaf locks.
    readers: Vec<Mutex<C>>,
    /// The queue of changes. `Sender` is Sync: every queue sends without a lock of ours.
    jobs: Sender<Msg<C>>,
    /// The lane ahead of the queue: its jobs (the heartbeat's, among others) go into the
    /// next batch before everything queued (see `SqlStore::queue_ahead`).
    ahead: Sender<Box<dyn Job<C>>>,
    /// The writing side (see [`Committer`]); whoever holds the mutex commits what is queued.
    /// Held for the batches of one drain. Taken after anything a caller of `submit` holds
    /// (a file's `flushing` mutex and write gate); inside it only the open table's shard
    /// locks (`is_open`), which are leaves.
    committer: Arc<Mutex<Committer<C>>>,
    /// Wakes the writer thread when a change was queued while the committer was busy;
    /// true: someone waits for it (drain now), false: a change answered early (gather first).
    wake: Sender<bool>,
    /// The writer thread has a wake for changes answered early that its next drain has not
    /// begun on: another such change sends none (see `SqlStore::queue`).
    gathering: Arc<AtomicBool>,
    /// See `CommitCounts`.
    batches: Arc<AtomicU64>,
    wakes: Arc<AtomicU64>,
    /// Changes the database commits per second, as recent batches measured it (0: not
    /// measured yet); written by the committer only. See `BACKLOG_DRAIN_MAX`.
    commit_rate: Arc<AtomicU64>,
    /// See `CommitCounts::updates_unwaited`; written by the committer only.
    updates_unwaited: Arc<AtomicU64>,
    /// The writer thread, joined by `close`. Taken once.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Stops and joins the engine's background thread; taken once, by `close`.
    background: Mutex<Option<Stoppable>>,
    pub session: u64,
    /// Sessions whose rows this one found (they ended without unmounting).
    crashed: Vec<u64>,
    session_expiry: Option<Duration>,
    contact: Arc<Contact>,
    clock: Arc<VolumeClock>,
    recent_dirs: Option<Arc<RecentDirs>>,
    /// The session's intent log, once `keep_intent_log` opened it (a mount that answers
    /// changes before their commit); shared with the committer.
    intent: Arc<OnceLock<IntentLog>>,
    /// Changes answered before their commit and not finished, at most (`async_backlog`):
    /// see `backlog_has_room`. Set with the intent log.
    backlog_max: AtomicU64,
    /// See `EngineParts::database_gone`.
    database_gone: Arc<AtomicBool>,
    /// The last `backlog_has_room` said no: its change of mind is logged once each way.
    held_back: AtomicBool,
    /// Changes that found the backlog full and waited for room (`lanefs stats`).
    room_waits: AtomicU64,
}

/// This session's contact with the database, as its heartbeats saw it.
#[derive(Default)]
struct Contact {
    /// Since when heartbeats have succeeded without a gap (0: the last one failed).
    since_ns: AtomicI64,
    /// The last heartbeat that succeeded (0: none yet).
    last_beat_ns: AtomicI64,
}

impl<C: Conn> SqlStore<C> {
    /// Starts the committer's thread over an engine's opened parts.
    pub fn start(parts: EngineParts<C>) -> Result<SqlStore<C>, String> {
        let session = parts.writer.session;
        let intent = Arc::new(OnceLock::new());
        let batches = Arc::new(AtomicU64::new(0));
        let commit_rate = Arc::new(AtomicU64::new(0));
        let updates_unwaited = Arc::new(AtomicU64::new(0));
        let (jobs, rx) = std::sync::mpsc::channel();
        let (ahead, ahead_rx) = std::sync::mpsc::channel();
        let recent_dirs = parts
            .recent_dir_ttl
            .filter(|ttl| !ttl.is_zero())
            .map(|ttl| Arc::new(RecentDirs::new(ttl)));
        let committer = Arc::new(Mutex::new(Committer {
            w: Some(parts.writer),
            rx,
            ahead_rx,
            closed: false,
            at_close: parts.at_close,
            recent_dirs: recent_dirs.clone(),
            intent: intent.clone(),
            finished: Watermark::default(),
            unrecorded: false,
            batches: batches.clone(),
            commit_rate: commit_rate.clone(),
            updates_unwaited: updates_unwaited.clone(),
        }));
        let (wake, wake_rx) = std::sync::mpsc::channel();
        let gathering = Arc::new(AtomicBool::new(false));
        let wakes = Arc::new(AtomicU64::new(0));
        let writer = {
            let committer = committer.clone();
            let (gathering, wakes) = (gathering.clone(), wakes.clone());
            std::thread::Builder::new()
                .name("lanefs-commit".into())
                .spawn(move || run_writer(committer, wake_rx, &gathering, &wakes))
                .map_err(|e| format!("starting the commit thread: {e}"))?
        };
        Ok(SqlStore {
            readers: parts.readers.into_iter().map(Mutex::new).collect(),
            jobs,
            ahead,
            committer,
            wake,
            gathering,
            batches,
            wakes,
            commit_rate,
            updates_unwaited,
            writer: Mutex::new(Some(writer)),
            background: Mutex::new(parts.background),
            session,
            crashed: parts.crashed,
            session_expiry: parts.session_expiry,
            contact: Arc::new(Contact::default()),
            clock: Arc::new(parts.clock),
            recent_dirs,
            intent,
            backlog_max: AtomicU64::new(0),
            database_gone: parts.database_gone,
            held_back: AtomicBool::new(false),
            room_waits: AtomicU64::new(0),
        })
    }

    fn reader(&self, queue: usize) -> MutexGuard<'_, C> {
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

    /// Whether changes answered before their commit go to an intent log.
    fn logging(&self) -> bool {
        self.intent.get().is_some()
    }

    /// Starts this session's intent log in `dir` (see `intent`): the file, and its row
    /// (watermark 0) committed before any change is logged. `backlog_max`: how many changes
    /// may wait answered for their commit (see `backlog_has_room`).
    pub fn keep_intent_log(
        &self,
        dir: &std::path::Path,
        host: &str,
        backlog_max: u64,
    ) -> Result<(), String> {
        let log = IntentLog::create(dir, self.session)?;
        let path = log.path().to_string_lossy().into_owned();
        let (session, host) = (self.session, host.to_owned());
        wait(|done| {
            self.submit(
                true,
                move |w| {
                    Ok(w.conn.execute(
                        "INSERT INTO intent_logs (session, host, path, applied, above) VALUES (?, ?, ?, 0, '')",
                        &args![session, host.as_str(), path.as_str()],
                    )?)
                },
                done,
            )
        })
        .map_err(|e| {
            let _ = log.remove();
            format!(
                "recording the intent log {}: {}",
                log.path().display(),
                std::io::Error::from_raw_os_error(e)
            )
        })?;
        self.backlog_max.store(backlog_max, Ordering::Relaxed);
        let _ = self.intent.set(log);
        Ok(())
    }

    /// Applies what crashed mounts of this machine answered and did not commit: every dead
    /// session's log in `dir` (one whose lock can be taken), from past its watermark, in
    /// order, each change in one transaction with the watermark's advance; then removes the
    /// log and its row. A change that no longer fits is logged with its cause and skipped.
    /// Also drops rows whose log in `dir` is gone (an end cut short between the two). Runs
    /// before the mount serves anything. Returns (applied, skipped).
    pub fn replay_intent_logs(&self, dir: &std::path::Path) -> Result<(u64, u64), String> {
        let mut totals = (0, 0);
        for log in intent::dead_logs(dir, Some(self.session))? {
            let dead = log.session;
            let row = self
                .read(0, |c| {
                    let row = c.query_opt(
                        "SELECT applied, above, path FROM intent_logs WHERE session = ?",
                        &args![dead],
                    )?;
                    row.map(|r| Ok((Watermark::parse(r.u64(0)?, &r.text(1)?), r.text(2)?)))
                        .transpose()
                })
                .map_err(|e| {
                    format!(
                        "reading the watermark of {}: {}",
                        log.path.display(),
                        std::io::Error::from_raw_os_error(e)
                    )
                })?;
            // A log is this volume's only if the volume recorded it, at that place, when its
            // session began (a row the same transaction as every batch keeps up to date).
            let mut watermark = match row {
                Some((watermark, path)) if std::path::Path::new(&path) == log.path => watermark,
                _ => {
                    tracing::warn!(
                        "volume: {} is not a log this volume recorded: not applied, left in place",
                        log.path.display()
                    );
                    continue;
                }
            };
            let pending: Vec<&(u64, Intent)> = log
                .records
                .iter()
                .filter(|(seq, _)| !watermark.covers(*seq))
                .collect();
            // What the watermark truly covers once the results are in: each record's job
            // commits the watermark past every record before it too (computed ahead), so
            // one that failed on its own would be covered by the next one's.
            let mut finished = watermark.clone();
            let mut results = Vec::with_capacity(pending.len());
            for (seq, intent) in pending {
                // Each record commits with the dead log's watermark past it.
                watermark = watermark.with([*seq]);
                let (done_to, done_above) = (watermark.applied, watermark.above_text());
                let intent = intent.clone();
                let shared = self.session_expiry.is_some();
                let clock = self.clock.clone();
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                let what = intent.describe();
                self.submit(
                    false,
                    move |w| {
                        if shared && !take_dead_lease(w, &intent, dead, clock.now_ns())? {
                            w.conn.execute(
                                ops::INTENT_APPLIED_SQL,
                                &args![done_to, done_above.as_str(), dead],
                            )?;
                            return Ok(Err(REPLAY_LEASE_LAPSED));
                        }
                        let mark = w.mark();
                        w.conn.batch("SAVEPOINT replay")?;
                        let outcome = apply_intent(w, &intent, shared.then(|| clock.now_ns()));
                        let end = match outcome {
                            Ok(()) => "RELEASE replay",
                            Err(_) => {
                                // What it recorded (directories' rows, change-log rows,
                                // rows it locked) goes with the savepoint.
                                w.roll_back_to(mark);
                                "ROLLBACK TO replay; RELEASE replay"
                            }
                        };
                        w.conn.batch(end)?;
                        w.conn.execute(
                            ops::INTENT_APPLIED_SQL,
                            &args![done_to, done_above.as_str(), dead],
                        )?;
                        Ok(outcome)
                    },
                    Box::new(move |r| {
                        let _ = tx.send(r);
                    }),
                );
                results.push((*seq, what, rx));
            }
            let (mut applied, mut skipped) = (0, 0);
            let mut failed = None;
            for (seq, what, rx) in results {
                let result = rx.recv().unwrap_or(Err(libc::EIO));
                if result.is_ok() {
                    finished = finished.with([seq]);
                }
                match result {
                    Ok(Ok(())) => applied += 1,
                    Ok(Err(REPLAY_LEASE_LAPSED)) => {
                        skipped += 1;
                        tracing::error!(
                            "volume: {what} (answered by crashed session {dead}, never committed, never acknowledged by an fsync) is dropped: its directory's lease ran out before this replay, so another mount may have changed it since"
                        );
                    }
                    Ok(Err(e)) => {
                        skipped += 1;
                        tracing::error!(
                            "volume: {} (answered by crashed session {dead}, never committed) cannot be applied now: {}; skipped",
                            what,
                            std::io::Error::from_raw_os_error(e)
                        );
                    }
                    Err(e) => {
                        failed.get_or_insert(format!(
                            "applying {} from {}: {}; the log stays for the next mount",
                            what,
                            log.path.display(),
                            std::io::Error::from_raw_os_error(e)
                        ));
                    }
                }
            }
            if let Some(failed) = failed {
                // The next mount applies what failed, and only that, under the leases this
                // replay took over, given back to the dead session (this mount's end would
                // drop them as its own).
                let (to, above) = (finished.applied, finished.above_text());
                let me = self.session;
                let _ = wait(|done| {
                    self.submit(
                        true,
                        move |w| {
                            w.conn.execute(
                                "UPDATE leases SET session = ? WHERE session = ?",
                                &args![dead, me],
                            )?;
                            Ok(w.conn.execute(
                                ops::INTENT_APPLIED_SQL,
                                &args![to, above.as_str(), dead],
                            )?)
                        },
                        done,
                    )
                });
                return Err(failed);
            }
            // The dead session's leases, and those the replay took over from it, go now: the
            // other mounts that wait for them go on, after the replayed changes.
            let me = self.session;
            wait(|done| {
                self.submit(
                    true,
                    move |w| {
                        Ok(w.conn.execute(
                            "DELETE FROM leases WHERE session = ? OR session = ?",
                            &args![dead, me],
                        )?)
                    },
                    done,
                )
            })
            .map_err(|e| {
                format!(
                    "committing what {} held and dropping its leases: {}",
                    log.path.display(),
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
            std::fs::remove_file(&log.path)
                .map_err(|e| format!("removing {}: {e}", log.path.display()))?;
            wait(|done| {
                self.submit(
                    false,
                    move |w| Ok(w.conn.execute(ops::DROP_INTENT_LOG_SQL, &args![dead])?),
                    done,
                )
            })
            .map_err(|e| {
                format!(
                    "dropping the row of {}: {}",
                    log.path.display(),
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
            if log.skipped_bytes > 0 {
                tracing::info!(
                    "volume: {} held {} bytes that are not a whole record (a copy the crash cut short, or remains of committed records): stepped over",
                    log.path.display(),
                    log.skipped_bytes
                );
            }
            if applied + skipped > 0 {
                tracing::info!(
                    "volume: applied {applied} changes that crashed session {dead} answered before their commit ({skipped} skipped, logged above)"
                );
            }
            totals.0 += applied;
            totals.1 += skipped;
        }
        self.drop_orphaned_intent_rows(dir)?;
        Ok(totals)
    }

    /// Rows of logs in `dir` whose file is gone (a clean end cut short after removing it).
    fn drop_orphaned_intent_rows(&self, dir: &std::path::Path) -> Result<(), String> {
        let rows = self
            .read(0, |c| {
                let rows = c.query("SELECT session, path FROM intent_logs", &[])?;
                let mut found = Vec::with_capacity(rows.len());
                for r in rows {
                    found.push((r.u64(0)?, r.text(1)?));
                }
                Ok(found)
            })
            .map_err(|e| {
                format!(
                    "reading intent_logs: {}",
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
        for (session, path) in rows {
            let path = std::path::Path::new(&path);
            if session == self.session || path.parent() != Some(dir) || path.exists() {
                continue;
            }
            let _ = wait(|done| {
                self.submit(
                    false,
                    move |w| Ok(w.conn.execute(ops::DROP_INTENT_LOG_SQL, &args![session])?),
                    done,
                )
            });
        }
        Ok(())
    }

    /// Runs a read on a read connection; once more after reconnecting if the connection was
    /// lost (a restarted server).
    pub(crate) fn read<T>(
        &self,
        queue: usize,
        mut op: impl FnMut(&mut C) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let mut conn = self.reader(queue);
        let result = op(&mut conn);
        match conn.take_failure() {
            Some(DbError::Lost(_)) if conn.reconnect() => {
                let again = op(&mut conn);
                conn.take_failure();
                again
            }
            _ => result,
        }
    }

    pub(crate) fn submit<T: Send + 'static>(
        &self,
        sync: bool,
        op: impl FnMut(&mut Writer<C>) -> Result<T, Errno> + Send + 'static,
        done: Done<T>,
    ) {
        self.queue(sync, true, None, op, done)
    }

    /// Queues a change; `inline`: the caller may commit it itself when nobody is committing
    /// (it waits for the answer anyway), else only the writer thread does. `record`: the
    /// change is answered before its commit, and this is its intent-log record (see
    /// `intent::record_of_create`), appended before this returns.
    fn queue<T: Send + 'static>(
        &self,
        sync: bool,
        inline: bool,
        record: Option<Vec<u8>>,
        op: impl FnMut(&mut Writer<C>) -> Result<T, Errno> + Send + 'static,
        done: Done<T>,
    ) {
        let mut job = Change::boxed(op, done, sync);
        let sent = match (record, self.intent.get()) {
            (Some(record), Some(log)) => {
                let mut sent = Ok(());
                log.append(record, |seq| {
                    job.logged = seq;
                    sent = self.jobs.send(Msg::Job(job));
                });
                sent
            }
            _ => self.jobs.send(Msg::Job(job)),
        };
        if let Err(std::sync::mpsc::SendError(Msg::Job(job))) = sent {
            // The writer is gone (unmounted): nothing can be committed.
            job.finish(Err(libc::EIO));
            return;
        }
        self.commit_or_wake(inline);
    }

    /// Queues a change ahead of everything queued: it goes into the next batch, and is
    /// committed as `submit`'s are. For the heartbeat, whose lateness the other mounts read
    /// as this mount's death: queued behind a backlog of changes answered early (up to
    /// `async_backlog` of them, many seconds of batches on a slow or distant database), it
    /// reached the database after the session expiry, so another mount ended this live
    /// session (every change refused from then on, the backlog with them), and this
    /// mount's directory leases lapsed while changes made under them still waited. And
    /// for the taking of inode numbers for early answers, which behind such a backlog held
    /// every create back for its commit. Only for changes that need no order with those
    /// queued before them; `inline` as for `queue`.
    fn queue_ahead<T: Send + 'static>(
        &self,
        inline: bool,
        op: impl FnMut(&mut Writer<C>) -> Result<T, Errno> + Send + 'static,
        done: Done<T>,
    ) {
        let job = Change::boxed(op, done, false);
        if let Err(std::sync::mpsc::SendError(job)) = self.ahead.send(job) {
            job.finish(Err(libc::EIO));
            return;
        }
        self.commit_or_wake(inline);
    }

    /// After a change was queued: commits a batch on this thread, or wakes the writer.
    fn commit_or_wake(&self, inline: bool) {
        // Commit on this thread when nobody is committing: a lone change (a create in a
        // shell loop) then costs no thread hand-off there and back, the largest part of its
        // latency on a busy 2-CPU machine. When the committer is busy, its holder or the
        // writer thread takes the change with the next batch (group commit as before).
        // The caller commits one batch at most, so a queue's worker never stays away from
        // its queue for long however busy the other queues keep the committer: a full batch
        // may have left changes behind, which the writer thread then takes.
        if !inline {
            // One wake per gathering: the job is in the queue before the flag is read, and
            // the writer clears the flag (reading it, so the job's send happens before) just
            // before its drain; a job whose sender found the flag set is taken by that drain.
            // A wake per change woke the writer, gathering in `recv_timeout`, once per change
            // (a futex wake and two context switches each, for nothing).
            if !self.gathering.swap(true, Ordering::AcqRel) {
                let _ = self.wake.send(false);
            }
            return;
        }
        let more = match self.committer.try_lock() {
            Ok(mut c) => c.drain(Some(1)),
            Err(TryLockError::Poisoned(p)) => p.into_inner().drain(Some(1)),
            Err(TryLockError::WouldBlock) => true,
        };
        if more {
            let _ = self.wake.send(true);
        }
    }
}

/// The writer's connection and the receiving end of the queue of changes. A caller of
/// `submit` that finds it free drains the queue itself; otherwise the writer thread is woken
/// and drains it once the holder lets go. Every queued change is thus committed: the one who
/// queued it either drains or wakes the thread, which drains after the current holder.
struct Committer<C: Conn> {
    /// None once the session ended: `close` drops the connection there, so the database is
    /// closed before the volume's lock is let go.
    w: Option<Writer<C>>,
    rx: Receiver<Msg<C>>,
    /// Jobs that go into the next batch before anything of `rx` (`SqlStore::queue_ahead`).
    ahead_rx: Receiver<Box<dyn Job<C>>>,
    /// The session ended (`close`): every change queued from now on is answered EIO.
    closed: bool,
    at_close: fn(&mut C),
    /// Where committed batches' directory attributes go (see `RecentDirs`).
    recent_dirs: Option<Arc<RecentDirs>>,
    /// The session's intent log (see `SqlStore::intent`).
    intent: Arc<OnceLock<IntentLog>>,
    /// The logged changes finished (committed, or failed at their commit).
    finished: Watermark,
    /// A batch of logged changes failed whole and no commit since has recorded `finished`.
    unrecorded: bool,
    /// Batches run, for `lanefs stats`.
    batches: Arc<AtomicU64>,
    /// See `SqlStore::commit_rate`.
    commit_rate: Arc<AtomicU64>,
    /// See `SqlStore::updates_unwaited`.
    updates_unwaited: Arc<AtomicU64>,
}

impl<C: Conn> Committer<C> {
    /// Folds a batch of `ops` changes that took `took` into the commit rate (a moving
    /// average: a quarter each new sample).
    fn measure_rate(&mut self, ops: usize, took: Duration) {
        if ops < RATE_SAMPLE_OPS_MIN {
            return;
        }
        let sample = (ops as f64 / took.as_secs_f64().max(1e-6)) as u64;
        let old = self.commit_rate.load(Ordering::Relaxed);
        let rate = if old == 0 {
            sample
        } else {
            (old * 3 + sample) / 4
        };
        self.commit_rate.store(rate.max(1), Ordering::Relaxed);
    }

    /// Commits what is queued, in batches of up to `BATCH_OPS_MAX` changes, until the queue
    /// is empty or `batches` batches were committed; whether changes may be left (the last
    /// batch was full).
    fn drain(&mut self, batches: Option<usize>) -> bool {
        let mut committed = 0;
        loop {
            if batches.is_some_and(|most| committed >= most) {
                return true;
            }
            let mut batch: Vec<Box<dyn Job<C>>> = Vec::new();
            while batch.len() < BATCH_OPS_MAX {
                match self.ahead_rx.try_recv() {
                    Ok(job) if self.closed || self.w.is_none() => job.finish(Err(libc::EIO)),
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
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
                Some(w) if !batch.is_empty() => {
                    let logged: Vec<u64> = batch
                        .iter()
                        .map(|j| j.logged())
                        .filter(|&s| s > 0)
                        .collect();
                    let finished =
                        (!logged.is_empty() || self.unrecorded).then(|| self.finished.with(logged));
                    let (ops, started) = (batch.len(), std::time::Instant::now());
                    let committed =
                        commit_batch(w, batch, self.recent_dirs.as_deref(), finished.as_ref());
                    self.batches.fetch_add(1, Ordering::Relaxed);
                    self.updates_unwaited
                        .store(w.updates_unwaited, Ordering::Relaxed);
                    self.measure_rate(ops, started.elapsed());
                    if let Some(finished) = finished {
                        self.finished = finished;
                        self.unrecorded = committed.is_err();
                        if let Some(log) = self.intent.get() {
                            log.note_finished(&self.finished);
                            if committed.is_ok() {
                                log.committed(&self.finished);
                            }
                        }
                    }
                }
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
/// busy, and ends the session once `close` queued its message. A wake for changes nobody
/// waits for first lets more gather for up to `BACKGROUND_GATHER` (see there); an urgent
/// wake in that time ends the wait.
fn run_writer<C: Conn>(
    committer: Arc<Mutex<Committer<C>>>,
    wake: Receiver<bool>,
    gathering: &AtomicBool,
    wakes: &AtomicU64,
) {
    while let Ok(urgent) = wake.recv() {
        wakes.fetch_add(1, Ordering::Relaxed);
        if !urgent {
            let until = std::time::Instant::now() + BACKGROUND_GATHER;
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                match wake.recv_timeout(left) {
                    Ok(urgent) => {
                        wakes.fetch_add(1, Ordering::Relaxed);
                        if urgent {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        let mut c = committer.lock().unwrap_or_else(|e| e.into_inner());
        // Changes queued from here on send a wake of their own (see `SqlStore::queue`).
        gathering.swap(false, Ordering::AcqRel);
        c.drain(None);
        if c.closed {
            // The log goes before its row: a row without its log is only a leftover, a log
            // without its row would be replayed whole. A log with changes that never
            // committed (the database was gone) stays, for the next mount to apply.
            let log_gone = match c.intent.get() {
                None => true,
                Some(log) if c.unrecorded || !c.finished.covers(log.last()) => {
                    tracing::error!(
                        "volume: changes answered before their commit could not be committed; {} keeps them for the next mount of the volume on this machine",
                        log.path().display()
                    );
                    false
                }
                Some(log) => match log.remove() {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!("volume: removing {}: {e}", log.path().display());
                        false
                    }
                },
            };
            if let Some(mut w) = c.w.take() {
                let session = w.session;
                let ended = w.conn.begin(false).and_then(|()| {
                    ops::end_session(&mut w.conn, session)?;
                    if log_gone {
                        w.conn.execute(ops::DROP_INTENT_LOG_SQL, &args![session])?;
                    }
                    w.conn.commit(false)
                });
                if let Err(e) = ended {
                    w.conn.rollback();
                    tracing::warn!("volume: ending the session: {e}");
                }
                (c.at_close)(&mut w.conn);
            }
            return;
        }
    }
}

/// What one run of a batch came to.
enum Run {
    Done(Result<(), Errno>),
    /// The transaction was rolled back for a reason that running it again may cure.
    Again(DbError),
    /// A change of a batch run without savepoints failed: the transaction was rolled back,
    /// to be run again with each change in a savepoint of its own.
    Isolate,
}

/// Runs a batch in one transaction; `savepoints`: each change in a savepoint of its own, so
/// that one failing leaves the others standing.
fn run_batch<C: Conn>(
    w: &mut Writer<C>,
    batch: &mut [Box<dyn Job<C>>],
    sync: bool,
    savepoints: bool,
    finished: Option<&Watermark>,
) -> Run {
    w.attr_events.clear();
    if let Err(e) = w.conn.begin(sync) {
        return match e {
            DbError::Retry(_) | DbError::Lost(_) => Run::Again(e),
            e => {
                tracing::error!("volume: cannot start a transaction: {e}");
                Run::Done(Err(e.errno()))
            }
        };
    }
    // On a shared volume every batch first takes a share lock on the session's row: another
    // mount that ends this session (its heartbeat late) deletes the row, and so waits for
    // a batch that holds the lock to end, or makes the next one find the row gone and fail
    // (EIO, the session fenced). Its cleanup of the ended session's unreferenced blocks
    // comes after that deletion, so it sees every chunk row this session ever committed:
    // without the lock, a batch queued behind a slow heartbeat could commit rows referring
    // to blocks the cleanup had just deleted. Sent with the batch's first statement (no
    // round trip of its own), its answer read before the COMMIT goes.
    if w.fenced || (w.log_changes && !ops::require_session(w)) {
        if let Some(e) = w.conn.take_failure() {
            w.conn.rollback();
            return Run::Again(e);
        }
        w.conn.rollback();
        return Run::Done(Err(libc::EIO));
    }
    let took_range = match w.refill(batch.len() as u64) {
        Ok(took) => took,
        Err(_) if w.conn.take_row_missing() => {
            w.conn.rollback();
            w.forget_range();
            w.fence();
            return Run::Done(Err(libc::EIO));
        }
        Err(e) => {
            w.conn.rollback();
            w.forget_range();
            return match e {
                DbError::Retry(_) | DbError::Lost(_) => Run::Again(e),
                e => {
                    tracing::error!("volume: taking inode numbers: {e}");
                    Run::Done(Err(e.errno()))
                }
            };
        }
    };
    // A rolled-back transaction takes back the range it took (if it took one); numbers of
    // an earlier range that the rolled-back changes used are simply never used.
    let roll_back = |w: &mut Writer<C>| {
        w.conn.rollback();
        if took_range {
            w.forget_range();
        }
    };
    let mut all_ok = true;
    // Not for a lone change: its failure to write them must fail it, not go unanswered.
    w.defer_log(!savepoints && batch.len() > 1);
    for job in batch.iter_mut() {
        all_ok &= job.apply(w, savepoints);
        if !all_ok && !savepoints {
            // The transaction is of no use now (on PostgreSQL it is aborted).
            break;
        }
    }
    // The intent log's watermark commits with the changes (with savepoints, the batch
    // commits even when one of them failed: the watermark passes it, a failure being final).
    let mut watermark_failed = None;
    if (all_ok || savepoints)
        && let Some(finished) = finished
        && let Err(e) = w.conn.execute_later(
            ops::INTENT_APPLIED_SQL,
            &args![finished.applied, finished.above_text().as_str(), w.session],
        )
    {
        watermark_failed = Some(e);
        all_ok = false;
    }
    if all_ok && let Err(e) = w.write_deferred_log() {
        // A failure to retry or reconnect is taken below; any other is one of the changes'
        // rows, found by running them again one savepoint each.
        tracing::debug!("volume: writing a batch's change log: {e}");
        all_ok = false;
    }
    // The session check's answer, if no statement took it along (all went with the
    // COMMIT): asked before the COMMIT, so that a connection lost here is retried (below)
    // rather than answered as lost at the COMMIT.
    let sent = if all_ok || savepoints {
        w.conn.send_required()
    } else {
        Ok(())
    };
    if w.conn.take_row_missing() {
        // The batch's session check found the row gone (see `ops::require_session`).
        w.fence();
    }
    if w.fenced {
        // The session check or a heartbeat in this batch found the session gone: nothing
        // of it may commit.
        roll_back(w);
        return Run::Done(Err(libc::EIO));
    }
    if let Some(e) = w.conn.take_failure() {
        roll_back(w);
        return Run::Again(e);
    }
    if let Some(e) = watermark_failed.filter(|_| savepoints) {
        roll_back(w);
        tracing::error!("volume: recording the intent log's watermark: {e}");
        return Run::Done(Err(e.errno()));
    }
    if !savepoints && !all_ok {
        roll_back(w);
        // A batch carrying the intent log's watermark runs again with savepoints even when
        // its lone change failed: the watermark must commit, or a replay after a kill -9
        // would apply again a change that failed (and was reported) here.
        if batch.len() > 1 || finished.is_some() {
            return Run::Isolate;
        }
        // The lone change failed (EEXIST, ENOENT…): nothing to commit; it is answered its
        // own errno.
        return Run::Done(Ok(()));
    }
    // (A statement that went with the check and failed fails as one sent with the COMMIT.)
    match sent.and_then(|()| w.conn.commit(sync)) {
        Ok(()) => Run::Done(Ok(())),
        Err(e) => {
            roll_back(w);
            match e {
                DbError::Retry(_) => Run::Again(e),
                // Lost at COMMIT: it may or may not have committed, so it is answered EIO
                // (never acknowledged, never run twice); the next batch reconnects.
                DbError::Lost(_) => {
                    tracing::error!(
                        "volume: the connection was lost at the commit of {} changes; they are answered EIO",
                        batch.len()
                    );
                    Run::Done(Err(libc::EIO))
                }
                // A statement sent with the COMMIT (`Tx::execute_later`) failed: one of the
                // changes' rows, found by running them again one savepoint each; a lone
                // change's own failure (a name taken is its EEXIST).
                _ if !savepoints && batch.len() > 1 => Run::Isolate,
                DbError::Unique => Run::Done(Err(libc::EEXIST)),
                e => {
                    tracing::error!("volume: commit of {} changes failed: {e}", batch.len());
                    Run::Done(Err(e.errno()))
                }
            }
        }
    }
}

/// Commits a batch (with the intent log's watermark `finished`, when given) and answers its
/// changes; whether it committed.
fn commit_batch<C: Conn>(
    w: &mut Writer<C>,
    mut batch: Vec<Box<dyn Job<C>>>,
    recent_dirs: Option<&RecentDirs>,
    finished: Option<&Watermark>,
) -> Result<(), Errno> {
    let sync = batch.iter().any(|j| j.sync());
    let foreign_changes_before = recent_dirs.map_or(0, RecentDirs::foreign_changes);
    // A savepoint per change costs two statements (on PostgreSQL two round trips, a fifth of
    // a create's), and changes rarely fail once answered (early answers were checked against
    // the mount's own state): a batch runs without them first, and only a batch in which a
    // change failed runs again with them, so that the failure costs that change alone.
    let mut savepoints = false;
    let mut tries = 0;
    let committed = loop {
        tries += 1;
        match run_batch(w, &mut batch, sync, savepoints, finished) {
            Run::Done(result) => break result,
            Run::Isolate => {
                savepoints = true;
                tries -= 1;
            }
            Run::Again(e) if tries >= BATCH_TRIES_MAX => {
                tracing::error!(
                    "volume: {} changes could not commit after {tries} tries ({e}); they are answered EIO",
                    batch.len()
                );
                break Err(libc::EIO);
            }
            Run::Again(DbError::Lost(cause)) => {
                tracing::warn!("volume: the metadata connection was lost ({cause}); reconnecting");
                if !w.conn.reconnect() {
                    break Err(libc::EIO);
                }
            }
            Run::Again(e) => {
                if tries == 1 || tries % 5 == 0 {
                    tracing::warn!(
                        "volume: the database gave up a transaction ({e}); try {tries} of {BATCH_TRIES_MAX}"
                    );
                }
                std::thread::sleep(BATCH_RETRY_BACKOFF_STEP * tries);
            }
        }
    };
    // Before the answers: a request that waited for this commit may ask for a directory's
    // attributes next.
    let events = w.attr_events.drain(..);
    match recent_dirs {
        Some(recent) if committed.is_ok() => recent.publish(events, foreign_changes_before),
        _ => drop(events),
    }
    answer(batch, committed);
    committed
}

/// Answers every job of a batch. An answer that panics (a bug in a completion) is logged and
/// the others are still answered: the writer, and with it the mount, goes on. Its own
/// request was answered EIO when its `Reply` was dropped in the unwinding.
fn answer<C: Conn>(batch: Vec<Box<dyn Job<C>>>, committed: Result<(), Errno>) {
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

/// A replayed record whose directory's lease the dead session no longer held (it ran out):
/// dropped, not applied.
const REPLAY_LEASE_LAPSED: Errno = libc::ESTALE;
/// How long a dead session's lease must still run for a replay to apply a record under it:
/// the record's transaction commits well within it, before another mount waiting for the
/// lease can go on.
const REPLAY_LEASE_MARGIN_NS: i64 = 1_000_000_000;

/// On a shared volume, whether a dead session's `intent` may still be applied: the dead
/// session answered it early under its lease on the directory (the parent of a create or
/// remove; the directory holding the inode of an attribute change or new file's bytes), and
/// while that lease runs no other mount has changed the directory (one that needs it
/// recalls the lease and waits for its expiry). Once it ran out, another mount may have
/// reused the name or written the file, and applying the old change would undo theirs (an
/// unlink of the new file an fsync acknowledged; old bytes over new). So the lease is taken
/// over by this replay (which the record's own checks then count as its own) when it still
/// runs for `REPLAY_LEASE_MARGIN_NS`, in the record's transaction; else the record is
/// dropped, as never acknowledged (fsync waits for the commit). A replay soon after the
/// kill, the usual restart, applies everything.
fn take_dead_lease<C: Conn>(
    w: &mut Writer<C>,
    intent: &Intent,
    dead: u64,
    now_ns: i64,
) -> Result<bool, DbError> {
    let dir = match intent {
        Intent::Create(node) => Some(node.parent),
        Intent::Remove { parent, .. } => Some(*parent),
        Intent::Inline(update) => parent_of(w, update.ino)?,
        Intent::Setattr { ino, .. } => parent_of(w, *ino)?,
    };
    let Some(dir) = dir else {
        return Ok(false);
    };
    let me = w.session;
    // Taken over for a whole lease time, so that a long replay applies the records of a
    // directory alike (not its creates and then, past the expiry, none of their bytes).
    let until = now_ns + ops::LEASE_TTL.as_nanos() as i64;
    let taken = w.conn.execute(
        "UPDATE leases SET session = ?, expires_ns = CASE WHEN expires_ns > ? THEN expires_ns ELSE ? END \
         WHERE dir = ? AND (session = ? OR session = ?) AND expires_ns > ?",
        &args![me, until, until, dir, dead, me, now_ns + REPLAY_LEASE_MARGIN_NS],
    )?;
    Ok(taken > 0)
}

/// The directory holding inode `ino` (one of its names'), if it has a name.
fn parent_of<C: Conn>(w: &mut Writer<C>, ino: u64) -> Result<Option<u64>, DbError> {
    w.conn
        .query_opt(
            "SELECT parent FROM entries WHERE ino = ? LIMIT 1",
            &args![ino],
        )?
        .map(|r| r.u64(0))
        .transpose()
}

/// One change of a dead session's intent log, by the code its synchronous form runs
/// (`ops`), with the same checks. `unleased_at_ns`: on a shared volume, the volume clock's
/// now, so that a create in a directory another mount leases now is refused.
fn apply_intent<C: Conn>(
    w: &mut Writer<C>,
    intent: &Intent,
    unleased_at_ns: Option<i64>,
) -> Result<(), Errno> {
    match intent {
        Intent::Create(node) => {
            // A directory the dead session made was leased from birth (that lease was in
            // the create's own uncommitted transaction): the replay leases it the same way,
            // for the records made in it after it.
            let lease_expires_ns = match unleased_at_ns {
                Some(now_ns) if node.mode & libc::S_IFMT == libc::S_IFDIR => {
                    Some(now_ns + ops::LEASE_TTL.as_nanos() as i64)
                }
                _ => None,
            };
            let node = NewNode {
                unleased_at_ns,
                lease_expires_ns,
                ..node.clone()
            };
            ops::create(w, &node).map(drop)
        }
        Intent::Remove {
            parent,
            name,
            dir,
            now_ns,
        } => {
            // Nothing is open on a mount that has not started serving.
            let none_open: IsOpen = Arc::new(|_| false);
            ops::remove(w, *parent, name, *dir, *now_ns, None, &none_open).map(drop)
        }
        Intent::Inline(update) => ops::update_data(w, &update.clone().into_data_update()).map(drop),
        Intent::Setattr { ino, change } => ops::setattr(w, *ino, change, None).map(drop),
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

impl<C: Conn> MetaStore for SqlStore<C> {
    fn lookup(&self, queue: usize, parent: u64, name: &[u8]) -> Result<InodeRec, Errno> {
        self.read(queue, |c| ops::lookup(c, parent, name))
    }

    fn getattr(&self, queue: usize, ino: u64) -> Result<InodeRec, Errno> {
        if let Some(rec) = self.recent_dirs.as_ref().and_then(|r| r.get(ino)) {
            return Ok(rec);
        }
        self.read(queue, |c| ops::getattr(c, ino))
    }

    fn getattrs(&self, queue: usize, inos: &[u64]) -> Result<Vec<InodeRec>, Errno> {
        let mut recs = Vec::with_capacity(inos.len());
        let mut unknown = Vec::with_capacity(inos.len());
        for &ino in inos {
            match self.recent_dirs.as_ref().and_then(|r| r.get(ino)) {
                Some(rec) => recs.push(rec),
                None => unknown.push(ino),
            }
        }
        if !unknown.is_empty() {
            recs.extend(self.read(queue, |c| ops::getattrs(c, &unknown))?);
        }
        Ok(recs)
    }

    fn readdir(&self, queue: usize, dir: u64) -> Result<Vec<DirItem>, Errno> {
        self.read(queue, |c| ops::readdir(c, dir))
    }

    fn names_in(&self, queue: usize, dir: u64, max: usize) -> Result<Option<NamesIn>, Errno> {
        self.read(queue, |c| ops::names_in(c, dir, max))
    }

    fn readlink(&self, queue: usize, ino: u64) -> Result<Vec<u8>, Errno> {
        self.read(queue, |c| ops::readlink(c, ino))
    }

    fn getxattr(&self, queue: usize, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.read(queue, |c| ops::getxattr(c, ino, name))
    }

    fn xattr_names_of(&self, queue: usize, inos: &[u64]) -> Result<InodesXattrNames, Errno> {
        self.read(queue, |c| ops::xattr_names_of(c, inos))
    }

    fn listxattr(&self, queue: usize, ino: u64) -> Result<Vec<Vec<u8>>, Errno> {
        self.read(queue, |c| ops::listxattr(c, ino))
    }

    fn load_file(&self, queue: usize, ino: u64) -> Result<FileRec, Errno> {
        self.read(queue, |c| {
            c.begin_read()?;
            let result = ops::load_file(c, ino);
            c.end_read();
            result
        })
    }

    fn usage(&self) -> Result<Usage, Errno> {
        self.read(0, |c| ops::usage(c))
    }

    fn create(&self, node: NewNode, done: Done<InodeRec>) {
        self.submit(false, move |w| ops::create(w, &node), done)
    }

    fn create_in_background(&self, node: NewNode, done: Done<InodeRec>) {
        let record = self.logging().then(|| intent::record_of_create(&node));
        self.queue(false, false, record, move |w| ops::create(w, &node), done)
    }

    fn remove_in_background(
        &self,
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        let record = self
            .logging()
            .then(|| intent::record_of_remove(parent, &name, dir, now_ns));
        self.queue(
            false,
            false,
            record,
            move |w| ops::remove(w, parent, &name, dir, now_ns, None, &is_open),
            done,
        )
    }

    fn update_data_in_background(&self, update: InlineUpdate, done: Done<Vec<u64>>) {
        let record = self.logging().then(|| intent::record_of_inline(&update));
        let data = update.into_data_update();
        self.queue(
            false,
            false,
            record,
            move |w| ops::update_data(w, &data),
            done,
        )
    }

    fn setattr_in_background(&self, ino: u64, change: AttrChange, done: Done<InodeRec>) {
        let record = self
            .logging()
            .then(|| intent::record_of_setattr(ino, &change));
        self.queue(
            false,
            false,
            record,
            move |w| ops::setattr(w, ino, &change, None),
            done,
        )
    }

    fn barrier(&self, done: Done<()>) {
        self.submit(false, |_| Ok(()), done)
    }

    fn backlog(&self) -> Backlog {
        Backlog {
            waiting: self.intent.get().map_or(0, IntentLog::backlog),
            database_gone: self.database_gone.load(Ordering::Relaxed),
        }
    }

    fn commit_counts(&self) -> CommitCounts {
        CommitCounts {
            batches: self.batches.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
            rate: self.commit_rate.load(Ordering::Relaxed),
            updates_unwaited: self.updates_unwaited.load(Ordering::Relaxed),
            room_waits: self.room_waits.load(Ordering::Relaxed),
        }
    }

    fn backlog_has_room(&self, wait: bool) -> Option<bool> {
        let Some(log) = self.intent.get() else {
            return Some(false);
        };
        let gone = self.database_gone.load(Ordering::Relaxed);
        let rate = self.commit_rate.load(Ordering::Relaxed);
        let drains = match rate {
            0 => UNMEASURED_BACKLOG_MAX,
            rate => rate
                .saturating_mul(BACKLOG_DRAIN_MAX.as_secs())
                .max(MEASURED_BACKLOG_MIN),
        };
        let max = self.backlog_max.load(Ordering::Relaxed).min(drains);
        let held = self.held_back.load(Ordering::Relaxed);
        // Once held back, early answers resume only when half the backlog has committed: a
        // database that barely keeps up would otherwise flip the mount (and log both lines)
        // at every batch.
        let limit = if held { max.div_ceil(2) } else { max };
        let mut waiting = log.backlog();
        let mut room = !gone && !log.full() && waiting < limit;
        if !room && !held && !gone && !log.full() {
            // Full, on a database that commits: room comes at its pace.
            if !wait {
                return None;
            }
            self.room_waits.fetch_add(1, Ordering::Relaxed);
            room = log.wait_for_backlog_below(max, ROOM_WAIT_MAX)
                // A batch that failed for the database gone finishes its changes too.
                && !self.database_gone.load(Ordering::Relaxed)
                && !log.full();
            waiting = log.backlog();
        }
        let gone = self.database_gone.load(Ordering::Relaxed);
        // Compared first: the common case writes no cache line that every queue reads.
        if held == room && self.held_back.swap(!room, Ordering::Relaxed) == room {
            if room {
                tracing::info!(
                    "volume: the database caught up; changes are answered before their commit again"
                );
            } else {
                let why = if gone {
                    "the database is gone".to_owned()
                } else if log.full() {
                    format!(
                        "the intent log is full ({waiting} answered changes wait for their commit)"
                    )
                } else {
                    format!(
                        "{waiting} answered changes wait for their commit (the database commits about {rate} a second, and finished none in {ROOM_WAIT_MAX:?})"
                    )
                };
                tracing::warn!(
                    "volume: {why}; changes are answered after their commit until it catches up"
                );
            }
        }
        Some(room)
    }

    fn delegate_inodes(&self, done: Done<(u64, u64)>) {
        // The writer thread's: an early create asks for the next range without waiting.
        self.queue_ahead(false, |w| Ok(w.take_range()?), done)
    }

    fn link(
        &self,
        ino: u64,
        parent: u64,
        name: Vec<u8>,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        done: Done<InodeRec>,
    ) {
        self.submit(
            false,
            move |w| ops::link(w, ino, parent, &name, now_ns, unleased_at_ns),
            done,
        )
    }

    fn remove(
        &self,
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        self.submit(
            false,
            move |w| ops::remove(w, parent, &name, dir, now_ns, unleased_at_ns, &is_open),
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
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Renamed>,
    ) {
        self.submit(
            false,
            move |w| {
                ops::rename(
                    w,
                    parent,
                    &name,
                    newparent,
                    &newname,
                    flags,
                    now_ns,
                    unleased_at_ns,
                    &is_open,
                )
            },
            done,
        )
    }

    fn setattr(
        &self,
        ino: u64,
        change: AttrChange,
        unleased_at_ns: Option<i64>,
        done: Done<InodeRec>,
    ) {
        self.submit(
            false,
            move |w| ops::setattr(w, ino, &change, unleased_at_ns),
            done,
        )
    }

    fn update_data(&self, update: DataUpdate, done: Done<Vec<u64>>) {
        self.submit(update.durable, move |w| ops::update_data(w, &update), done)
    }

    fn setxattr(&self, ino: u64, set: XattrSet, unleased_at_ns: Option<i64>, done: Done<()>) {
        self.submit(
            false,
            move |w| ops::setxattr(w, ino, &set, unleased_at_ns),
            done,
        )
    }

    fn removexattr(&self, ino: u64, name: Vec<u8>, unleased_at_ns: Option<i64>, done: Done<()>) {
        self.submit(
            false,
            move |w| ops::removexattr(w, ino, &name, unleased_at_ns),
            done,
        )
    }

    fn free_orphan(&self, ino: u64, done: Done<Vec<u64>>) {
        self.submit(false, move |w| ops::free_orphan(w, ino), done)
    }

    fn sync(&self, done: Done<()>) {
        // A sync commits one changed row (the session's heartbeat) with `sync` set. On
        // SQLite an empty transaction writes no WAL frame, so its COMMIT under
        // synchronous=FULL would fsync nothing; this one's frames follow those of every
        // earlier commit in the WAL, and the fsync of the WAL at this commit makes all of
        // them durable. On PostgreSQL every COMMIT is durable when it returns
        // (synchronous_commit on), so this only waits for the changes queued before it.
        // Anything acknowledged before this job was queued was committed by an earlier
        // batch or is in this one.
        let clock = self.clock.clone();
        self.submit(true, move |w| ops::heartbeat(w, clock.now_ns()), done)
    }

    fn forget_blocks(&self, blocks: Vec<u64>, done: Done<()>) {
        self.submit(false, move |w| ops::forget_blocks(w, &blocks), done)
    }

    fn blocks_between(&self, lo: u64, hi: u64) -> Result<Vec<u64>, Errno> {
        self.read(0, |c| ops::blocks_between(c, lo, hi))
    }

    fn volume_now_ns(&self) -> i64 {
        self.clock.now_ns()
    }

    fn crashed_sessions(&self) -> Vec<u64> {
        self.crashed.clone()
    }

    fn pending_gc(&self) -> Result<Vec<u64>, Errno> {
        self.read(0, |c| ops::pending_gc(c))
    }

    fn heartbeat(&self, now_ns: i64, done: Done<Beat>) {
        // Other sessions are ended only by a mount that has itself been in contact with the
        // database for a whole expiry period: after an outage, every mount gets that long to
        // beat again before anyone judges it dead.
        let expiry = self.session_expiry.filter(|expiry| {
            let since = self.contact.since_ns.load(Ordering::Relaxed);
            since != 0 && now_ns - since >= expiry.as_nanos() as i64
        });
        let contact = self.contact.clone();
        let clock = self.clock.clone();
        let gap_max = self
            .session_expiry
            .map_or(i64::MAX, |e| e.as_nanos() as i64 / 2);
        self.queue_ahead(
            true,
            move |w| {
                clock
                    .read_server(&mut w.conn, CLOCK_READING_ROUND_TRIP_MAX)
                    .map_err(|e| e.errno())?;
                // Stamped when it runs, not when it was queued (`now_ns`, which this mount's
                // own reckoning of its leases keeps: the earlier, the safer): the wait for
                // the batch before is no silence of this mount's.
                let at_ns = clock.now_ns().max(now_ns);
                ops::heartbeat(w, at_ns)?;
                let mut beat = Beat::default();
                if w.log_changes {
                    // Its rows carry this machine's times (see `ops::Writer::log`).
                    ops::trim_change_log(w, crate::now_ns())?;
                    beat.leases = ops::renew_leases(w, at_ns + ops::LEASE_TTL.as_nanos() as i64)?;
                }
                let Some(expiry) = expiry else {
                    return Ok(beat);
                };
                let stale_before = now_ns - expiry.as_nanos() as i64;
                let ended = ops::expire_sessions(w, stale_before, crate::now_ns())?;
                if !ended.is_empty() {
                    tracing::info!(
                        "volume: ended sessions {ended:?}: no heartbeat for {} s",
                        expiry.as_secs()
                    );
                }
                beat.ended = ended;
                Ok(beat)
            },
            Box::new(move |result| {
                if result.is_ok() {
                    let last = contact.last_beat_ns.swap(now_ns, Ordering::Relaxed);
                    if last == 0 || now_ns - last > gap_max {
                        contact.since_ns.store(now_ns, Ordering::Relaxed);
                    }
                } else {
                    contact.since_ns.store(0, Ordering::Relaxed);
                }
                done(result)
            }),
        )
    }

    fn close(&self) {
        let background = self
            .background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((stop, handle)) = background {
            let _ = stop.send(());
            let _ = handle.join();
        }
        let _ = self.jobs.send(Msg::Close);
        let _ = self.wake.send(true);
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    fn touch_atimes(&self, mut take: AtimeTake, done: Done<Vec<(u64, i64)>>) {
        self.queue(
            false,
            false,
            None,
            move |w| {
                let atimes = take();
                ops::touch_atimes(w, &atimes)?;
                Ok(atimes)
            },
            done,
        )
    }

    fn fileattr_flags(&self) -> Result<Vec<(u64, u32)>, Errno> {
        self.read(0, |c| ops::fileattr_flags(c))
    }

    fn hold_orphan(&self, ino: u64, done: Done<bool>) {
        // Ahead of the queue: the change-log reader waits for it, and a hold needs no
        // order with this mount's queued changes (it only keeps another mount's unlink
        // from freeing the inode; a later last close's let-go stays in order behind it).
        self.queue_ahead(true, move |w| ops::hold_orphan(w, ino), done)
    }

    fn release_hold(&self, ino: u64, done: Done<()>) {
        self.submit(false, move |w| ops::release_hold(w, ino), done)
    }

    fn sweep_orphans(&self, before_ns: i64, is_open: IsOpen, done: Done<Vec<u64>>) {
        // Committed by the writer thread: the upkeep thread that queues it waits for none.
        self.queue(
            false,
            false,
            None,
            move |w| ops::sweep_orphans(w, before_ns, &is_open),
            done,
        )
    }

    fn lock_conflict(&self, queue: usize, req: &LockReq) -> Result<Option<LockHolder>, Errno> {
        let session = self.session;
        self.read(queue, |c| ops::lock_conflict(c, session, req))
    }

    fn set_lock(&self, req: LockReq, done: Done<Option<LockHolder>>) {
        self.submit(false, move |w| ops::set_lock(w, &req), done)
    }

    fn release_locks(&self, ino: u64, owner: Option<(u64, LockKind)>, done: Done<()>) {
        self.submit(false, move |w| ops::release_locks(w, ino, owner), done)
    }

    fn foreign_lease(&self, queue: usize, dir: u64, now_ns: i64) -> Result<Option<u64>, Errno> {
        let session = self.session;
        self.read(queue, |c| ops::foreign_lease(c, session, dir, now_ns))
    }

    fn lookup_and_foreign_lease(
        &self,
        queue: usize,
        parent: u64,
        name: &[u8],
        now_ns: i64,
    ) -> Result<NameAndLease, Errno> {
        let session = self.session;
        self.read(queue, |c| {
            ops::lookup_and_foreign_lease(c, session, parent, name, now_ns)
        })
    }

    fn recalled_leases(&self) -> Result<Vec<u64>, Errno> {
        let session = self.session;
        self.read(0, |c| ops::recalled_leases(c, session))
    }

    fn change_lease(&self, change: LeaseChange, done: Done<bool>) {
        // A recall only marks another session's lease: it needs no order with this mount's
        // queued changes, and a mount waiting for the lease it recalls has a deadline.
        // A take and a release keep their order (a release queued earlier must not undo a
        // take of the same directory queued later, and a release commits after the changes
        // answered under its lease).
        if let LeaseChange::Recall { .. } = change {
            return self.queue_ahead(true, move |w| ops::change_lease(w, change), done);
        }
        // This mount's record of a directory it takes the lease of may be older than
        // another mount's change of it that the change log has not brought yet: creates
        // under the lease build their inodes from the directory's group and mode.
        let done: Done<bool> = match (&change, self.recent_dirs.clone()) {
            (&LeaseChange::Take { dir, .. }, Some(recent)) => Box::new(move |r| {
                if let Ok(true) = r {
                    recent.forget_foreign(dir);
                }
                done(r)
            }),
            _ => done,
        };
        self.queue(
            false,
            false,
            None,
            move |w| ops::change_lease(w, change),
            done,
        )
    }

    fn changes_since(
        &self,
        cursors: &mut std::collections::HashMap<u64, u64>,
    ) -> Result<Vec<ChangeRec>, Errno> {
        if self.session_expiry.is_none() {
            return Ok(Vec::new());
        }
        let session = self.session;
        let changes = self.read(0, |c| ops::changes_since(c, session, cursors))?;
        if let Some(recent) = &self.recent_dirs {
            for change in &changes {
                recent.forget_foreign(change.ino);
                recent.forget_foreign(change.parent);
            }
        }
        Ok(changes)
    }

    fn set_fileattr_flags(
        &self,
        ino: u64,
        flags: u32,
        may_guard: bool,
        ctime_ns: i64,
        done: Done<()>,
    ) {
        self.submit(
            false,
            move |w| ops::set_fileattr_flags(w, ino, flags, may_guard, ctime_ns),
            done,
        )
    }
}
