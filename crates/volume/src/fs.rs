//! `VolumeFs`: the volume as a FUSE file system. Requests become MetaStore reads (on the
//! calling queue's thread) and changes (answered by the store's committer after the commit),
//! and file data goes through each open inode's [`FileState`].

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use lanefs_fuse::abi::{self, fattr, fopen, init_flags};
use lanefs_fuse::{DirBuffer, Filesystem, InitRequest, Reply, Request};

use crate::acl;
use crate::dirops::{self, AsyncDirops, ErrorReport};
use crate::file::{Backpressure, DataPath, DirtyBudget, FileState, Reload};
use crate::meta::*;
use crate::now_ns;
use crate::volume::VolumeLock;

mod atime;
mod changes;
mod fileattr;
mod known;
mod locks;
mod setid;
mod writeback;

pub use atime::AtimeSwitch;
use lanefs_fuse::atime::Atime;
use lanefs_fuse::caller::Waiting;

/// Shards of the open-file and directory-handle tables.
const OPEN_SHARDS: usize = 64;
/// How often a mount of a shared volume reads the other mounts' change log: the bound on
/// how long its kernel caches can hold what another mount changed.
pub const CHANGE_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// A shared volume's file that lost its last name is freed no sooner than this after the
/// unlink, so that every other mount's change-log poll (every `CHANGE_POLL_INTERVAL`) has
/// seen it and, if it has the file open, holds it: twenty polls, for a busy database.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// How often the session's heartbeat row is refreshed (by default; see
/// `VolumeOptions::heartbeat_interval`).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// statfs's usage figures are recomputed at most this often.
const USAGE_REFRESH: Duration = Duration::from_secs(1);
/// Spare blocks (`DataPath::release_block`) are deleted once the reaper was this long without
/// a block to release: a burst of overwrites keeps its spares, and the disk space of the last
/// ones comes back within this.
const SPARES_IDLE: Duration = Duration::from_secs(30);
/// Changes answered before their commit that may wait for it at once, by default: about
/// three seconds of a create loop's work on SQLite, thirty batches; each costs about 1 KiB
/// of memory until it commits (its overlay entries and its queued change).
pub const ASYNC_BACKLOG: u64 = 32 << 10;
/// Longest name (bytes), as statfs reports.
const NAME_MAX: usize = 255;
/// Largest xattr value (bytes), as Linux's own limit.
const XATTR_VALUE_MAX: usize = 64 << 10;

/// Mount options of the volume.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    /// statfs's size; None: the data directory's file system's.
    pub capacity: Option<u64>,
    /// Answer O_DIRECT opens with FOPEN_PARALLEL_DIRECT_WRITES (seed 000's switch).
    pub parallel_writes: bool,
    /// The mount's atime flags at mount time (a remount changes them through
    /// [`VolumeFs::atime_switch`]).
    pub atime: Atime,
    /// Other mounts share the volume (PostgreSQL): opens do not keep the page cache, so an
    /// open sees what another mount wrote and closed (close-to-open).
    pub shared: bool,
    /// How often the session's heartbeat row is refreshed.
    pub heartbeat_interval: Duration,
    /// Commit a file's data at each close(2) (FLUSH). Off (`--no-flush-on-close`), opens
    /// are answered FOPEN_NOFLUSH and the data is committed when the open file is released
    /// (RELEASE, which the kernel sends without waiting for it once the last descriptor
    /// of the open is closed): two synchronous round trips fewer per `echo x > f`, and
    /// close(2) no longer waits for the commit, nor returns its error (logged and counted
    /// in `flush_errors`; an fsync before the close still returns it). Another open on this
    /// mount sees the data at once either way (the file's state stays in the open table
    /// until its data is committed).
    pub flush_on_close: bool,
    /// Answer creates, mkdirs, unlinks and rmdirs before they commit where the answer is
    /// known (see `dirops`); only on a volume one mount holds. Off: `--no-async-dirops`.
    pub async_dirops: bool,
    /// Where the session's intent log goes (see `intent`); None: beside an SQLite
    /// database, or /var/lib/lanefs/intent/<volume id> for a shared volume.
    pub intent_dir: Option<std::path::PathBuf>,
    /// Changes answered before their commit that may wait for it at once; past it (or when
    /// the intent log is full, or the database gone) changes wait for their commit.
    pub async_backlog: u64,
    /// On PostgreSQL: how long a lost connection is waited for before operations fail with
    /// EIO (`postgres::RECONNECT_WAIT_MAX` by default).
    pub database_wait: Option<Duration>,
    /// The memory the mount's unflushed writes may hold (see `file::DirtyBudget`); None:
    /// an eighth of the machine's, within [64 MiB, 1 GiB].
    pub dirty_max: Option<u64>,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            capacity: None,
            parallel_writes: true,
            atime: Atime::default(),
            shared: false,
            heartbeat_interval: HEARTBEAT_INTERVAL,
            flush_on_close: true,
            async_dirops: true,
            intent_dir: None,
            async_backlog: ASYNC_BACKLOG,
            database_wait: None,
            dirty_max: None,
        }
    }
}

/// Open inodes: ino → state. Each mutex protects one shard's map and the `opens` counts of
/// its states; held for a map operation only. Leaf locks (the store's committer takes one
/// inside `is_open`, holding the committer's mutex and, when a flush or truncate commits on
/// its own thread, that file's `flushing` mutex and gate).
struct OpenTable {
    shards: Vec<Mutex<HashMap<u64, Arc<FileState>>>>,
    /// The mount's, which every state's chunk buffers count in.
    budget: Arc<DirtyBudget>,
}

impl OpenTable {
    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, Arc<FileState>>> {
        self.shards[(ino as usize) % OPEN_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, ino: u64) -> Option<Arc<FileState>> {
        self.shard(ino).get(&ino).cloned()
    }

    /// Counts an open (registered before the inode is read, so that an unlink racing with
    /// the open finds it and keeps the inode as an orphan).
    fn open(&self, ino: u64) -> Arc<FileState> {
        let mut shard = self.shard(ino);
        let state = shard
            .entry(ino)
            .or_insert_with(|| Arc::new(FileState::new(ino, self.budget.clone())))
            .clone();
        state.opens.fetch_add(1, Ordering::Relaxed);
        state
    }

    /// Uncounts an open; the state when it was the last.
    fn release(&self, ino: u64) -> Option<Arc<FileState>> {
        let mut shard = self.shard(ino);
        let state = shard.get(&ino)?.clone();
        if state.opens.fetch_sub(1, Ordering::Relaxed) == 1 {
            shard.remove(&ino);
            return Some(state);
        }
        None
    }

    /// For the store: is `ino` open? If so it is marked orphaned (it just lost its last name).
    fn mark_orphan_if_open(&self, ino: u64) -> bool {
        match self.shard(ino).get(&ino) {
            Some(state) => {
                state.orphaned.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn all(&self) -> Vec<Arc<FileState>> {
        self.all_where(|_| true)
    }

    /// The states with unflushed writes.
    fn unflushed(&self) -> Vec<Arc<FileState>> {
        self.all_where(FileState::unflushed)
    }

    fn all_where(&self, wanted: impl Fn(&FileState) -> bool) -> Vec<Arc<FileState>> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .filter(|state| wanted(state))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// An open directory: its listing (ino, type, name), taken at the first READDIR (offset 0)
/// so that entries removed or added during a listing (rm -rf) neither skip nor repeat
/// others. Only names: a later READDIRPLUS reads its entries' records again (see `list`).
type DirSnapshot = Arc<Mutex<Option<Vec<(u64, u32, Vec<u8>)>>>>;

struct DirHandles {
    /// fh → snapshot. Each mutex protects one shard's map; leaf locks.
    shards: Vec<Mutex<HashMap<u64, DirSnapshot>>>,
    next: AtomicU64,
}

impl DirHandles {
    fn shard(&self, fh: u64) -> MutexGuard<'_, HashMap<u64, DirSnapshot>> {
        self.shards[(fh as usize) % OPEN_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// To the reaper thread.
/// Queues the freeing of this session's unheld orphans of a shared volume unlinked before
/// `before_ns`; the blocks it releases go to the reaper, and `then` runs once it committed
/// or failed.
fn sweep_orphans(
    store: &dyn MetaStore,
    open: &Arc<OpenTable>,
    reaper: &Sender<ReapMsg>,
    before_ns: i64,
    then: impl FnOnce() + Send + 'static,
) {
    let is_open: IsOpen = {
        let open = open.clone();
        Arc::new(move |ino| open.mark_orphan_if_open(ino))
    };
    let reaper = reaper.clone();
    store.sweep_orphans(
        before_ns,
        is_open,
        Box::new(move |swept| {
            match swept {
                Ok(released) if !released.is_empty() => {
                    let _ = reaper.send(ReapMsg::Blocks(released));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    "volume: freeing unlinked files: {} (tried again at the next heartbeat)",
                    errno_name(e)
                ),
            }
            then()
        }),
    )
}

/// What the overlay of early-answered changes borrows from the file system (see `dirops`).
fn dirops_hooks(
    open: &Arc<OpenTable>,
    reaper: &Sender<ReapMsg>,
    session_fd: &Arc<std::sync::OnceLock<i32>>,
) -> dirops::Hooks {
    let (open, reaper, session_fd) = (open.clone(), reaper.clone(), session_fd.clone());
    dirops::Hooks {
        open_here: Box::new(move |ino| open.get(ino).is_some()),
        reap: Box::new(move |blocks| send_reap(&reaper, blocks)),
        forget: Box::new(move |ino, name| {
            let Some(&fd) = session_fd.get() else {
                return;
            };
            // Not on the committer's thread: the kernel takes the directory's lock to drop
            // the entry, and a request of that directory may hold it while it waits for a
            // commit on this very thread.
            let _ = std::thread::Builder::new()
                .name("lanefs-forget".into())
                .spawn(move || {
                    if let Some(name) = name {
                        let _ = lanefs_fuse::notify::inval_entry(fd, ino, &name);
                    }
                    let _ = lanefs_fuse::notify::inval_inode_attrs(fd, ino);
                });
        }),
    }
}

/// The reaper thread's name, by which `destroy` tells it from the others to join it last.
const REAPER_THREAD: &str = "lanefs-reaper";

enum ReapMsg {
    /// Blocks released by a commit: delete them from the block store.
    Blocks(Vec<u64>),
    /// Blocks a flush or a compaction replaced with new ones: kept as spares while more
    /// writes are likely to come, else deleted (`DataPath::release_block`).
    Replaced(Vec<u64>),
    /// Sessions that ended without unmounting (kill -9, a crash, or a shared volume's
    /// session another mount ended): delete the blocks they wrote but never committed. Here
    /// rather than where the sessions were found ended: listing a long-lived session's
    /// blocks (on S3, 1,000 a request) and deleting them one by one takes minutes, which on
    /// the heartbeat thread would stop this mount's heartbeats until other mounts ended it
    /// too, and at mount would do so before its heartbeat thread had started.
    EndedSessions(Vec<u64>),
    /// Unmounting: finish what is queued and end.
    Stop,
}

pub struct VolumeFs {
    /// The metadata store as the file system sees it: `dirops` over the engine's store.
    store: Arc<dyn MetaStore>,
    /// Changes answered before their commit, and their errors (see `dirops`).
    dirops: Arc<AsyncDirops>,
    data: Arc<DataPath>,
    open: Arc<OpenTable>,
    dirs: DirHandles,
    options: VolumeOptions,
    /// The data directory, for statfs's capacity; None when the blocks are remote (S3).
    data_dir: Option<std::path::PathBuf>,
    /// Blocks released by commits, to the reaper thread (`Sender` is Sync: no lock).
    reaper: Sender<ReapMsg>,
    /// A message (or its end) on each stops the heartbeat thread and the upkeep thread.
    background_stops: Vec<Sender<()>>,
    /// The reaper, heartbeat, upkeep and lock threads, joined at unmount. Taken by `destroy` only.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// statfs's usage figures, refreshed at most every USAGE_REFRESH (racing refreshes are
    /// harmless): when (ms after `started`), inodes, bytes.
    usage_at_ms: AtomicU64,
    usage_inodes: AtomicU64,
    usage_bytes: AtomicU64,
    started: std::time::Instant,
    /// Flushes that failed and were reported: counted for `lanefs stats`.
    flush_errors: AtomicU64,
    /// Writes that passed a file's dirty limit and so waited for a flush (back-pressure).
    flush_waits: AtomicU64,
    /// Writes that met the mount's dirty cap and so waited for the writeback.
    dirty_cap_waits: AtomicU64,
    /// Flushes the writeback thread made (`writeback`).
    writeback_flushes: AtomicU64,
    /// The writeback thread, once started (`VolumeFs::new`); stopped first at unmount.
    writeback: OnceLock<writeback::Writeback>,
    /// The mount's atime flags (see `atime`).
    atime: AtimeSwitch,
    /// Opens whose first read has yet to apply the relatime rule (see `atime`).
    atime_due: atime::AtimeDue,
    /// Atimes moved and not yet committed, overlaid on every attribute answer (see `atime`).
    pending_atimes: Arc<atime::PendingAtimes>,
    /// chattr's flags of the inodes that have any (see `fileattr`).
    fileattrs: Arc<fileattr::FileAttrs>,
    /// Open inodes known to have no set-ID bits and no capability (see `setid`).
    no_privileges: Arc<known::NoPrivileges>,
    /// flock and POSIX locks of a shared volume (see `locks`).
    locks: locks::Locks,
    /// Directories' default ACLs, which a create inherits (see `known`).
    default_acls: Arc<known::DefaultAcls>,
    /// Inodes' xattr names, which answer most GETXATTRs (see `known`).
    xattr_names: Arc<known::XattrNames>,
    /// The session's /dev/fuse fd, for notifications; set once the session is connected.
    session_fd: Arc<std::sync::OnceLock<i32>>,
    /// The volume's lock: let go at the very end of `destroy`, after the session ended and
    /// the database was closed, before the daemon says it is unmounted.
    lock: VolumeLock,
    /// This file system, for the jobs that answer slow requests off their queue.
    me: Weak<VolumeFs>,
}

/// The Reply of a request run by `VolumeFs::with_lease_waits`: answered
/// `dirops::WAIT_OFF_QUEUE`, it runs the request again off the queue instead.
struct LeaseReply {
    reply: Reply,
    again: Option<Box<dyn FnOnce(Reply) + Send>>,
}

impl LeaseReply {
    fn error(self, e: Errno) {
        match (e, self.again) {
            (dirops::WAIT_OFF_QUEUE, Some(again)) => again(self.reply),
            // Only a deferring run gets it; the rerun waits instead.
            (dirops::WAIT_OFF_QUEUE, None) => self.reply.error(libc::EIO),
            (e, _) => self.reply.error(e),
        }
    }

    /// The Reply, for a success.
    fn ok(self) -> Reply {
        self.reply
    }
}

/// Answers `result`: OK, or its errno.
fn answer(reply: Reply, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn errno_name(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

impl VolumeFs {
    pub fn new(
        store: Arc<dyn MetaStore>,
        data: Arc<DataPath>,
        data_dir: Option<std::path::PathBuf>,
        options: VolumeOptions,
        lock: VolumeLock,
    ) -> Arc<VolumeFs> {
        let dirops = AsyncDirops::new(store, options.async_dirops, options.shared);
        let store: Arc<dyn MetaStore> = dirops.clone();
        let mut threads = Vec::new();
        let (reap_tx, reap_rx) = channel::<ReapMsg>();
        {
            let store = store.clone();
            let data = data.clone();
            match std::thread::Builder::new()
                .name(REAPER_THREAD.into())
                .spawn(move || reap(store, data, reap_rx))
            {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    tracing::warn!(
                        "volume: no reaper thread ({e}): released blocks, and those that ended sessions wrote but never committed, stay until gc"
                    )
                }
            }
        }
        match store.pending_gc() {
            Ok(left) if !left.is_empty() => {
                let _ = reap_tx.send(ReapMsg::Blocks(left));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("volume: listing blocks to delete: {}", errno_name(e)),
        }
        let _ = reap_tx.send(ReapMsg::EndedSessions(store.crashed_sessions()));
        let session_fd = Arc::new(std::sync::OnceLock::new());
        let open = Arc::new(OpenTable {
            shards: (0..OPEN_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            budget: data.dirty.clone(),
        });
        // Another mount may change them: no longer than the kernel keeps attributes.
        let known_max_age = options.shared.then_some(options.attr_timeout);
        let default_acls = Arc::new(known::DefaultAcls::new(known_max_age));
        let xattr_names = Arc::new(known::XattrNames::new(known_max_age));
        let fileattrs = Arc::new(fileattr::FileAttrs::load(&*store));
        let no_privileges = Arc::new(known::NoPrivileges::new(known_max_age));
        let mut stops = Vec::new();
        {
            // This thread beats and does nothing else: the upkeep below may wait for the
            // committer, behind a backlog of changes answered early, and a heartbeat that
            // waited with it was read by the other mounts as this mount's death (they ended
            // its session: every change refused, the backlog with them) and let its
            // directory leases lapse while changes made under them still waited. (The
            // heartbeat itself goes ahead of the backlog: see `SqlStore::queue_ahead`.)
            let (stop, stopped) = channel::<()>();
            stops.push(stop);
            let store = store.clone();
            let reaper = reap_tx.clone();
            let interval = options.heartbeat_interval;
            match std::thread::Builder::new()
                .name("lanefs-heartbeat".into())
                .spawn(move || {
                    // Beats start `interval` apart, or back to back while a beat takes longer
                    // (it waits for the batch being committed, then commits in the next).
                    let mut next = std::time::Instant::now() + interval;
                    while let Err(RecvTimeoutError::Timeout) = stopped
                        .recv_timeout(next.saturating_duration_since(std::time::Instant::now()))
                    {
                        next = std::time::Instant::now() + interval;
                        // A shared volume's heartbeat ends sessions that stopped beating:
                        // their uncommitted blocks go as a crashed session's do at a mount.
                        if let Ok(beat) = wait(|done| store.heartbeat(store.volume_now_ns(), done))
                            && !beat.ended.is_empty()
                        {
                            let _ = reaper.send(ReapMsg::EndedSessions(beat.ended));
                        }
                    }
                }) {
                Ok(handle) => threads.push(handle),
                Err(e) => tracing::warn!("volume: no heartbeat thread ({e})"),
            }
        }
        if options.shared {
            // A shared mount's upkeep: every CHANGE_POLL_INTERVAL it reads the other mounts'
            // change log and serves their recalls of this mount's directory leases; every
            // heartbeat interval it lets go the leases left idle and frees this session's
            // unheld orphans.
            let (stop, stopped) = channel::<()>();
            stops.push(stop);
            let store = store.clone();
            let leases = dirops.clone();
            let swept_open = open.clone();
            let reaper = reap_tx.clone();
            let interval = options.heartbeat_interval;
            let mut follower = changes::Follower {
                cursors: HashMap::new(),
                session_fd: session_fd.clone(),
                failing: false,
                open: open.clone(),
                default_acls: default_acls.clone(),
                xattr_names: xattr_names.clone(),
                fileattrs: fileattrs.clone(),
                no_privileges: no_privileges.clone(),
            };
            match std::thread::Builder::new()
                .name("lanefs-upkeep".into())
                .spawn(move || {
                    // A sweep queued and not committed yet (behind a backlog): none more.
                    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let mut last_round = std::time::Instant::now();
                    let tick = CHANGE_POLL_INTERVAL.min(interval);
                    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                        follower.poll(&*store);
                        leases.serve_recalls();
                        if last_round.elapsed() < interval {
                            continue;
                        }
                        last_round = std::time::Instant::now();
                        leases.let_go_idle();
                        if !sweeping.swap(true, Ordering::AcqRel) {
                            let before = now_ns() - ORPHAN_GRACE.as_nanos() as i64;
                            let sweeping = sweeping.clone();
                            sweep_orphans(&*store, &swept_open, &reaper, before, move || {
                                sweeping.store(false, Ordering::Release)
                            });
                        }
                    }
                }) {
                Ok(handle) => threads.push(handle),
                Err(e) => tracing::warn!(
                    "volume: no upkeep thread ({e}): other mounts' changes are not seen and their lease recalls not served"
                ),
            }
        }
        let (locks, lock_thread) = locks::Locks::new(&store, options.shared);
        threads.extend(lock_thread);
        dirops.set_hooks(dirops_hooks(&open, &reap_tx, &session_fd));
        let fs = Arc::new_cyclic(|me| VolumeFs {
            me: me.clone(),
            dirops,
            locks,
            atime: AtimeSwitch::new(options.atime),
            atime_due: atime::AtimeDue::new(),
            pending_atimes: Arc::new(atime::PendingAtimes::new()),
            fileattrs,
            no_privileges,
            default_acls,
            xattr_names,
            session_fd,
            store,
            data,
            open,
            dirs: DirHandles {
                shards: (0..OPEN_SHARDS)
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect(),
                next: AtomicU64::new(1),
            },
            options,
            data_dir,
            reaper: reap_tx,
            background_stops: stops,
            threads: Mutex::new(threads),
            usage_at_ms: AtomicU64::new(u64::MAX),
            usage_inodes: AtomicU64::new(0),
            usage_bytes: AtomicU64::new(0),
            started: std::time::Instant::now(),
            flush_errors: AtomicU64::new(0),
            flush_waits: AtomicU64::new(0),
            dirty_cap_waits: AtomicU64::new(0),
            writeback_flushes: AtomicU64::new(0),
            writeback: OnceLock::new(),
            lock,
        });
        if let Some(writeback) = writeback::Writeback::start(Arc::downgrade(&fs)) {
            let _ = fs.writeback.set(writeback);
        }
        fs
    }

    /// Answers a request that may wait long (a commit behind a busy or unreachable
    /// database, block uploads to the object store) from the engine's offload pool. Over
    /// io_uring a worker serves every request of its CPU, and a close or fsync waiting
    /// there would make that CPU's lseek and stat calls wait too (seed 002's guarantee);
    /// over /dev/fuse a few such waits take every worker. (The passthrough keeps fsync on
    /// a /dev/fuse worker: a host fsync ends; a database that went away may not come back
    /// for minutes.)
    fn answer_off_queue(&self, reply: Reply, job: impl FnOnce(&VolumeFs, Reply) + Send + 'static) {
        match self.me.upgrade() {
            Some(fs) => reply.offload(move |reply| job(&fs, reply)),
            None => job(self, reply),
        }
    }

    /// Runs `op`, the body of a request that may meet another mount's live lease on a
    /// directory (a lookup, listing, open or change there), on this worker with such waits
    /// deferred: when it met one, it changed nothing and answered `WAIT_OFF_QUEUE` through
    /// its `LeaseReply`, which runs it again from the offload pool, where it waits for the
    /// recall (a dead holder's lease lasts up to `LEASE_TTL`: 10 s of a queue's requests
    /// otherwise). A volume one mount holds has no leases: `op` just runs.
    fn with_lease_waits(
        &self,
        reply: Reply,
        op: impl Fn(&VolumeFs, LeaseReply) + Send + Sync + 'static,
    ) {
        // The volume's kind first: the upgrade is an atomic on a count every queue shares.
        let me = match self.options.shared.then(|| self.me.upgrade()).flatten() {
            Some(me) => me,
            None => return op(self, LeaseReply { reply, again: None }),
        };
        let op = Arc::new(op);
        let again = {
            let op = op.clone();
            Box::new(move |reply: Reply| {
                me.answer_off_queue(reply, move |fs, reply| {
                    dirops::deferring_lease_waits(false, || {
                        op(fs, LeaseReply { reply, again: None })
                    })
                })
            })
        };
        dirops::deferring_lease_waits(true, || {
            op(
                self,
                LeaseReply {
                    reply,
                    again: Some(again),
                },
            )
        })
    }

    /// An O_CREAT open of a name the kernel believes free: the new file, opened. A name that
    /// another mount of a shared volume took since the kernel's lookup is not opened here:
    /// the kernel would take it for the file it created, and skip the permission check and
    /// O_TRUNC of opening an existing file. ESTALE (unless O_EXCL: EEXIST) makes it walk
    /// the path again once with LOOKUP_REVAL, under which FUSE looks a negative entry up
    /// afresh, and open what it finds as open(2) does. (No NOTIFY_INVAL_ENTRY here: it
    /// takes the directory's lock, which the kernel holds until this CREATE is answered.)
    fn create_and_open(&self, node: NewNode, flags: u32, reply: LeaseReply) {
        let exclusive = flags as i32 & libc::O_EXCL != 0;
        let rec = match wait(|done| self.store.create(node, done)) {
            Ok(rec) => rec,
            Err(libc::EEXIST) if !exclusive => return reply.error(libc::ESTALE),
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.fileattrs.may_open(rec.ino, flags) {
            return reply.error(e);
        }
        match self.open_created(&rec) {
            Ok(_) => reply
                .ok()
                .create(&self.entry_out(&rec), &self.open_out(&rec, flags)),
            Err(e) => reply.error(e),
        }
    }

    /// readdir and readdirplus: a listing taken at offset 0 (or the stream's first read),
    /// then the entries from `arg.offset` that fit.
    fn list(&self, queue: usize, ino: u64, arg: &abi::ReadIn, plus: bool, reply: LeaseReply) {
        let Some(snapshot) = self.dirs.shard(arg.fh).get(&arg.fh).cloned() else {
            return reply.error(libc::EBADF);
        };
        let mut listing = snapshot.lock().unwrap_or_else(|e| e.into_inner());
        // The directory, when this request took its listing (its atime may move).
        let mut listed = None;
        // The records read with the listing by this request (by entry; none for . and ..).
        let mut records = Vec::new();
        let read_after_commits = self.pending_atimes.commits();
        if listing.is_none() || arg.offset == 0 {
            // Errors are answered without the listing's lock: a deferred lease wait runs
            // this again, on this very thread when the offload pool is full.
            let read = self
                .store
                .getattr(queue, ino)
                .and_then(|dir| Ok((dir, self.store.readdir(queue, ino)?)));
            let (dir, items) = match read {
                Ok(read) => read,
                Err(e) => {
                    drop(listing);
                    return reply.error(e);
                }
            };
            let mut all = Vec::with_capacity(items.len() + 2);
            all.push((ino, libc::DT_DIR as u32, b".".to_vec()));
            all.push((
                dir.parent.max(ROOT_INO),
                libc::DT_DIR as u32,
                b"..".to_vec(),
            ));
            records.extend([None, None]);
            for item in items {
                let typ = item
                    .attr
                    .as_ref()
                    .map_or(item.kind, |a| (a.mode & libc::S_IFMT) >> 12);
                all.push((item.ino, typ, item.name));
                records.push(item.attr);
            }
            *listing = Some(all);
            listed = Some(dir);
        }
        let Some(all) = listing.as_ref() else {
            return reply.error(libc::EIO);
        };
        // What READDIRPLUS says of entry `i`: the kernel takes it as the inode's attributes
        // (with no attribute validity of their own, it still sets the size from them), so
        // a later request reads the records of the entries it answers again, in one read,
        // rather than answer from the listing's (a file written and closed since showed its
        // old size). No entry (nodeid 0) for . and .., and for an entry removed since.
        let mut reread = HashMap::new();
        // The inodes of the entries this READDIRPLUS answers, but . and ..
        let answered: Vec<u64> = if plus {
            let from = (arg.offset as usize).min(all.len());
            let fitting = DirBuffer::plus_entries_fitting(
                arg.size as usize,
                all[from..].iter().map(|(_, _, name)| &name[..]),
            );
            (from.max(2)..from + fitting).map(|i| all[i].0).collect()
        } else {
            Vec::new()
        };
        if !answered.is_empty() {
            // `ls -l` asks each of them for two xattrs next.
            self.learn_xattr_names(queue, &answered);
            if records.is_empty() {
                let inos = &answered;
                let read = self.pending_atimes.read(|| {
                    self.store.getattrs(queue, inos).map(|recs| {
                        recs.iter()
                            .map(|rec| (rec.ino, self.entry_out(rec)))
                            .collect::<HashMap<_, _>>()
                    })
                });
                // A failed read answers names only, as for entries removed since.
                reread = read.unwrap_or_default();
            }
        }
        let entry_out = |i: usize, ino: u64| match records.get(i) {
            Some(rec) => rec.as_ref().map(|rec| self.entry_out(rec)),
            None if i < 2 => None,
            None => reread.get(&ino).copied(),
        };
        let fill = |attrs_valid: bool| {
            let entry_out = |i, ino| {
                let mut out = entry_out(i, ino).unwrap_or_default();
                if !attrs_valid {
                    (out.attr_valid, out.attr_valid_nsec) = (0, 0);
                }
                out
            };
            let listing = all.iter().map(|(ino, typ, name)| (*ino, *typ, &name[..]));
            DirBuffer::from_listing(
                arg.size as usize,
                listing,
                arg.offset,
                plus.then_some(entry_out),
            )
        };
        let mut buf = fill(true);
        if plus && !records.is_empty() && self.pending_atimes.missed_since(read_after_commits) {
            // The records read with the listing may lack an atime (see `PendingAtimes`):
            // the kernel asks GETATTR before it answers from these.
            buf = fill(false);
        }
        drop(listing);
        self.reply_listing(listed.as_ref(), buf.as_bytes(), reply.ok())
    }

    /// unlink (`dir` false) and rmdir.
    fn remove(&self, queue: usize, parent: u64, name: &OsStr, dir: bool, reply: Reply) {
        let name = name.to_owned();
        self.with_lease_waits(reply, move |fs, reply| {
            if let Err(e) = fs.may_unlink(queue, parent, &name) {
                return reply.error(e);
            }
            let fs_reaper = fs.reaper.clone();
            fs.store.remove(
                parent,
                name.as_bytes().to_vec(),
                dir,
                now_ns(),
                None,
                fs.is_open(),
                Box::new(move |r| match r {
                    Ok(removed) => {
                        reply.ok().ok();
                        send_reap(&fs_reaper, removed.released);
                    }
                    Err(e) => reply.error(e),
                }),
            )
        })
    }

    /// Drops this mount's locks on `ino` (one owner's, or all) and wakes its waiters; a
    /// failure is logged (the locks then go with the session).
    fn release_locks(&self, ino: u64, owner: Option<(u64, LockKind)>) {
        if let Err(e) = wait(|done| self.store.release_locks(ino, owner, done)) {
            tracing::error!(
                "volume: releasing locks on inode {ino}: {}; tried again at its last close here (else they go when this mount ends)",
                errno_name(e)
            );
            self.locks.release_failed(ino);
        }
        self.locks.released(ino);
    }

    fn attr(&self, rec: &InodeRec) -> abi::Attr {
        let mut rec = rec.clone();
        self.pending_atimes.overlay(&mut rec);
        // An open file's own size, unless another mount changed it since (and this mount
        // has nothing of its own to write over that): then the store's is the newer.
        if let Some(state) = self.open.get(rec.ino)
            && !state.stale()
        {
            rec.size = state.size();
            if let Some(t) = state.dirty_mtime() {
                rec.mtime_ns = t;
                rec.ctime_ns = t;
            }
        }
        to_attr(&rec)
    }

    fn entry_out(&self, rec: &InodeRec) -> abi::EntryOut {
        let (ev, evn) = split_duration(self.options.entry_timeout);
        let (av, avn) = split_duration(self.options.attr_timeout);
        abi::EntryOut {
            nodeid: rec.ino,
            generation: 0,
            entry_valid: ev,
            entry_valid_nsec: evn,
            attr_valid: av,
            attr_valid_nsec: avn,
            attr: self.attr(rec),
        }
    }

    fn attr_out(&self, rec: &InodeRec) -> abi::AttrOut {
        let (av, avn) = split_duration(self.options.attr_timeout);
        abi::AttrOut {
            attr_valid: av,
            attr_valid_nsec: avn,
            attr: self.attr(rec),
            ..Default::default()
        }
    }

    fn is_open(&self) -> IsOpen {
        let open = self.open.clone();
        Arc::new(move |ino| open.mark_orphan_if_open(ino))
    }

    /// Deletes released blocks in the background.
    fn reap(&self, blocks: Vec<u64>) {
        if blocks.is_empty() {
            return;
        }
        let _ = self.reaper.send(ReapMsg::Blocks(blocks));
    }

    /// Gives up blocks that new ones replaced, in the background.
    fn reap_replaced(&self, blocks: Vec<u64>) {
        if blocks.is_empty() {
            return;
        }
        let _ = self.reaper.send(ReapMsg::Replaced(blocks));
    }

    /// A new inode named `name` in `parent`, owned by the caller (the store applies a
    /// set-group-ID parent's group inside the create's transaction), its mode and ACLs
    /// from the requested `mode` and the caller's `umask` (DONT_MASK: the kernel leaves
    /// both to us) and the directory's default ACL (`acl::inherit`).
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<Vec<u8>>,
    ) -> Result<NewNode, Errno> {
        if name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        self.fileattrs.may_add_to(parent)?;
        let default = if mode & libc::S_IFMT == libc::S_IFLNK {
            None
        } else {
            self.default_acl(req.queue, parent)?
        };
        let inherit = (mode & libc::S_IFMT != libc::S_IFLNK).then(|| Inherit {
            mode,
            umask,
            default: default.as_deref().map(<[u8]>::to_vec),
        });
        let (mode, xattrs) = acl::inherit(default.as_deref(), mode, umask);
        Ok(NewNode {
            ino: None,
            parent,
            name: name.as_bytes().to_vec(),
            mode,
            uid: req.uid,
            gid: req.gid,
            rdev,
            target,
            now_ns: now_ns(),
            lease_expires_ns: None,
            unleased_at_ns: None,
            xattrs,
            inherit,
        })
    }

    /// The default ACL of directory `dir`: remembered, or read (and remembered).
    fn default_acl(&self, queue: usize, dir: u64) -> Result<Option<Arc<[u8]>>, Errno> {
        let since = match self.default_acls.get(dir) {
            Ok(known) => return Ok(known),
            Err(since) => since,
        };
        let default = match self.store.getxattr(queue, dir, acl::DEFAULT_XATTR) {
            Ok(value) => Some(Arc::from(value)),
            Err(libc::ENODATA) => None,
            Err(e) => return Err(e),
        };
        self.default_acls.set_read(dir, default.clone(), since);
        Ok(default)
    }

    /// A setxattr or removexattr (`run(store, unleased_at_ns, done)`) of xattr `name` of
    /// `ino`; `inherited`: it changes what the files created in a directory inherit (its
    /// default ACL, its set-group-ID bit), so that on a shared volume a directory's change
    /// must recall another mount's lease on it, under which that mount answers creates
    /// there early (`AsyncDirops::change_of_dir`).
    fn change_xattr(
        &self,
        queue: usize,
        ino: u64,
        name: Vec<u8>,
        inherited: bool,
        reply: Reply,
        run: impl Fn(&Arc<dyn MetaStore>, Option<i64>, Done<()>) + Send + Sync + 'static,
    ) {
        let of_dir = inherited
            && self.options.shared
            && self.store.getattr(queue, ino).is_ok_and(|rec| rec.is_dir());
        if !of_dir {
            let done = self.xattr_change_done(ino, &name, LeaseReply { reply, again: None });
            return run(&self.store, None, done);
        }
        let run = Arc::new(run);
        self.with_lease_waits(reply, move |fs, reply| {
            let (store, run) = (fs.store.clone(), run.clone());
            let done = fs.xattr_change_done(ino, &name, reply);
            fs.dirops
                .change_of_dir(ino, move |at_ns, done| run(&store, at_ns, done), done)
        })
    }

    /// Before a change of xattr `name` of `ino`: the change's answer. What this mount knows
    /// of the inode's xattrs is forgotten now and again once the change is made: its names,
    /// a directory's default ACL (a create that read the old one meanwhile must not leave
    /// it behind), and an open file's "none" (a state loaded meanwhile may have read the
    /// store before the commit).
    fn xattr_change_done(&self, ino: u64, name: &[u8], reply: LeaseReply) -> Done<()> {
        let default_acls = (name == acl::DEFAULT_XATTR).then(|| {
            self.default_acls.forget(ino);
            self.default_acls.clone()
        });
        // A file capability set: writes look again for it (before the commit and after).
        let no_privileges = (name == setid::CAPABILITY_XATTR).then(|| {
            self.forget_privileges(ino);
            self.no_privileges.clone()
        });
        self.xattr_names.forget(ino);
        if let Some(state) = self.open.get(ino) {
            state.xattrs_changing();
        }
        let (open, xattr_names) = (self.open.clone(), self.xattr_names.clone());
        Box::new(move |r| {
            if let Some(acls) = default_acls {
                acls.forget(ino);
            }
            if let Some(no_privileges) = no_privileges {
                no_privileges.forget(ino);
            }
            xattr_names.forget(ino);
            if let Some(state) = open.get(ino) {
                state.xattrs_changing();
            }
            match r {
                Ok(()) => reply.ok().ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    /// Reads and keeps the xattr names of those of `inos` whose names are not known, in one
    /// read; one that fails leaves them to be read one by one.
    fn learn_xattr_names(&self, queue: usize, inos: &[u64]) {
        let since: HashMap<u64, known::Generation> = inos
            .iter()
            .filter_map(|&ino| self.xattr_names.get(ino).err().map(|since| (ino, since)))
            .collect();
        if since.is_empty() {
            return;
        }
        let unknown: Vec<u64> = since.keys().copied().collect();
        let Ok(found) = self.store.xattr_names_of(queue, &unknown) else {
            return;
        };
        for (ino, names) in found {
            if let Some(&since) = since.get(&ino) {
                self.xattr_names.set_read(ino, names.into(), since);
            }
        }
    }

    /// The names of `ino`'s xattrs that callers see: known, or read (and kept).
    fn xattr_names(&self, queue: usize, ino: u64) -> Result<Arc<[Vec<u8>]>, Errno> {
        let since = match self.xattr_names.get(ino) {
            Ok(known) => return Ok(known),
            Err(since) => since,
        };
        let names: Arc<[Vec<u8>]> = self.store.listxattr(queue, ino)?.into();
        self.xattr_names.set_read(ino, names.clone(), since);
        Ok(names)
    }

    /// Whether `ino` is open here with no xattr a caller can list or get: known from its
    /// load on a volume no other mount changes (`xattrs_changing` keeps it true).
    fn xattrs_absent(&self, ino: u64) -> bool {
        !self.options.shared && self.open.get(ino).is_some_and(|s| s.xattrs_absent())
    }

    fn reply_new_entry(&self, node: Result<NewNode, Errno>, reply: Reply) {
        let node = match node {
            Ok(node) => node,
            Err(e) => return reply.error(e),
        };
        self.with_lease_waits(reply, move |fs, reply| {
            let out = fs.entry_template();
            // A new directory's default ACL is known (its parent's, or none): creates in
            // it read none, even before its own create commits.
            let default_acls = fs.default_acls.clone();
            let default: Option<Arc<[u8]>> = node
                .xattrs
                .iter()
                .find(|(name, _)| name == acl::DEFAULT_XATTR)
                .map(|(_, value)| Arc::from(&value[..]));
            fs.store.create(
                node.clone(),
                Box::new(move |r| match r {
                    Ok(rec) => {
                        if rec.is_dir() {
                            default_acls.set(rec.ino, default);
                        }
                        reply.ok().entry(&out.fill(&rec))
                    }
                    Err(e) => reply.error(e),
                }),
            )
        })
    }

    /// What a completion running on the committer needs to build answers.
    fn entry_template(&self) -> EntryTemplate {
        EntryTemplate {
            entry_timeout: self.options.entry_timeout,
            attr_timeout: self.options.attr_timeout,
            pending_atimes: self.pending_atimes.clone(),
        }
    }

    /// The error of a change on `ino` that was answered before its commit and then failed,
    /// as `by` is to see it (see `AsyncDirops::take_error`).
    fn early_answer_error(&self, ino: u64, by: ErrorReport) -> Result<(), Errno> {
        match self.dirops.take_error(ino, by) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A close's flush, or the one before an explicit mtime of an open file: a file this
    /// mount created, still small, has its bytes queued behind its create without waiting
    /// when directory operations are answered early (on a shared volume, while this mount
    /// holds the lease of the file's directory) (`echo x > new` then waits for no commit, nor
    /// does tar's futimens before its close; a failure is the next fsync's to report, see
    /// `dirops`); any other, as usual.
    fn flush_new_early(&self, state: &FileState, by: ErrorReport) -> Result<(), Errno> {
        // A file whose create failed at its commit has nowhere to put its bytes.
        self.early_answer_error(state.ino, by)?;
        if self.queue_new_early(state, false) {
            return Ok(());
        }
        self.flush_state(state)
    }

    /// The early half of `flush_new_early`: queues the commit of a new small file's bytes
    /// when its directory's lease allows; true when it did (or nothing was to commit).
    /// `wait_for_room`: in a full backlog, wait for room (off a queue's worker only).
    fn queue_new_early(&self, state: &FileState, wait_for_room: bool) -> bool {
        let dir = state.created_in.load(Ordering::Relaxed);
        if dir == 0 {
            return false;
        }
        let Some(_lease) = self.dirops.lease_for_data_of(dir, wait_for_room) else {
            return false;
        };
        let dirops = &self.dirops;
        state.flush_early(&|update, done| dirops.update_data_early(update, done))
    }

    fn flush_state(&self, state: &FileState) -> Result<(), Errno> {
        self.flush_state_with(state, false).map(drop)
    }

    /// `flush_state`, durable for an fsync (see `FileState::flush_with`); whether a durable
    /// commit happened.
    fn flush_state_with(&self, state: &FileState, durable: bool) -> Result<bool, Errno> {
        let flushed = state.flush_with(&self.data, &*self.store, durable);
        let committed_durably = flushed.as_ref().is_ok_and(|(_, durably)| *durably);
        self.flushed(flushed.map(|(released, _)| released))
            .map(|()| committed_durably)
    }

    /// A flush's end, whichever kind: the blocks it released go to the reaper, a failure is
    /// counted.
    fn flushed(&self, released: Result<Vec<u64>, Errno>) -> Result<(), Errno> {
        match released {
            Ok(released) => {
                self.reap_replaced(released);
                Ok(())
            }
            Err(e) => {
                self.flush_errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// A release's end: one open fewer, and the last one's cleanup.
    fn release_open(&self, ino: u64) {
        if let Some(last) = self.open.release(ino) {
            // No process of this mount has the file open: none can hold a lock on it, so
            // whatever an owner's FLUSH or RELEASE did not name goes now.
            if self.locks.forget_inode(ino) {
                self.release_locks(ino, None);
            }
            self.last_release(last);
        }
    }

    /// The last release of an inode: flush, and free it if it lost its last name.
    fn last_release(&self, state: Arc<FileState>) {
        self.forget_privileges(state.ino);
        if let Err(e) = self.flush_state(&state) {
            tracing::error!(
                "volume: flushing inode {} at its last close: {}",
                state.ino,
                errno_name(e)
            );
        }
        state.retire();
        if self.options.shared {
            // Freed by the sweep of the session that owns the orphan (this one or another),
            // once no mount holds it.
            if state.held_for_other_mount.load(Ordering::Relaxed)
                && let Err(e) = wait(|done| self.store.release_hold(state.ino, done))
            {
                tracing::error!(
                    "volume: letting go of unlinked inode {}: {} (it goes with this session)",
                    state.ino,
                    errno_name(e)
                );
            }
        } else if state.orphaned.load(Ordering::Relaxed) {
            match wait(|done| self.store.free_orphan(state.ino, done)) {
                Ok(released) => self.reap(released),
                Err(e) => tracing::error!(
                    "volume: freeing unlinked inode {}: {} (fsck will)",
                    state.ino,
                    errno_name(e)
                ),
            }
        }
    }

    /// Counts an open of an existing inode. On a shared volume it forgets the inode's xattr
    /// names first: close-to-open holds for xattrs too (what another mount set before this
    /// open is read again; a first open reads them with the file), and the forget refuses
    /// any read of them begun before it.
    fn open_existing(&self, ino: u64) -> Arc<FileState> {
        if self.options.shared {
            self.xattr_names.forget(ino);
        }
        self.open.open(ino)
    }

    fn open_state(&self, req: &Request, ino: u64) -> Result<Arc<FileState>, Errno> {
        let state = self.open_existing(ino);
        let store = &self.store;
        match state.load(|| store.load_file(req.queue, ino)) {
            Ok(()) => Ok(state),
            Err(e) => {
                if let Some(last) = self.open.release(ino) {
                    drop(last);
                }
                Err(e)
            }
        }
    }

    /// Opens regular file `ino`. The first open of a file reads its record with its content
    /// (one read transaction), and its checks use that record; a file open already is read
    /// again for them: its attributes, and on a shared volume its content too (close-to-open:
    /// another mount may have changed it since this mount's first open).
    fn open_file(&self, req: &Request, ino: u64, flags: u32) -> Result<abi::OpenOut, Errno> {
        let state = self.open_existing(ino);
        let names_since = self.xattr_names.generation(ino);
        let load = || {
            let file = self.store.load_file(req.queue, ino)?;
            if let Some(names) = &file.xattr_names {
                self.xattr_names
                    .set_read(ino, Arc::from(&names[..]), names_since);
            }
            Ok(file)
        };
        let mut first = None;
        let loaded = state.load(|| {
            let file = load()?;
            first = Some(file.attr.clone());
            Ok(file)
        });
        let checked = loaded
            .and_then(|()| match first {
                Some(rec) => Ok(rec),
                None if self.options.shared => state.reload(&load),
                None => self.store.getattr(req.queue, ino),
            })
            .and_then(|rec| match rec {
                rec if rec.is_dir() => Err(libc::EISDIR),
                rec if !rec.is_reg() => Err(libc::EINVAL),
                rec => self.fileattrs.may_open(ino, flags).map(|()| rec),
            });
        match checked {
            Ok(rec) => {
                let mut out = self.open_out(&rec, flags);
                // A read-only open has nothing of its own to commit at close(2), so it
                // costs no FLUSH round trip (one of cp -a's seven per file it reads).
                // Another open's unflushed writes are committed by that open's close or
                // fsync; an early-answered change's failure is reported by a close that
                // flushes, and by fsync, as before. On a shared volume FLUSH also drops
                // the closing owner's POSIX locks, which are ours there (a read lock
                // needs only a read-only open).
                if !self.options.shared && flags as i32 & libc::O_ACCMODE == libc::O_RDONLY {
                    out.open_flags |= fopen::NOFLUSH;
                }
                Ok(out)
            }
            Err(e) => {
                if let Some(last) = self.open.release(ino) {
                    drop(last);
                }
                Err(e)
            }
        }
    }

    /// Opens an inode this request has just created, without reading it back from the store:
    /// its content is the create's own record (empty, no chunks). Nothing can have written it
    /// in between: its number is new, and its name is reachable only once the kernel has our
    /// answer (an O_CREAT open holds the parent's lock exclusively until then). Saves a read
    /// transaction (three statements) per create.
    fn open_created(&self, rec: &InodeRec) -> Result<Arc<FileState>, Errno> {
        let state = self.open.open(rec.ino);
        state.load(|| {
            Ok(FileRec {
                attr: rec.clone(),
                ..Default::default()
            })
        })?;
        // Inode numbers are never reused, so this state is the new inode's own.
        state.capability_absent.store(true, Ordering::SeqCst);
        state.created_in.store(rec.parent, Ordering::Relaxed);
        self.created_without_privileges(rec);
        Ok(state)
    }

    fn open_flags(&self, flags: u32) -> u32 {
        let mut f = if flags as i32 & libc::O_DIRECT != 0 {
            let mut f = fopen::DIRECT_IO;
            if self.options.parallel_writes {
                f |= fopen::PARALLEL_DIRECT_WRITES;
            }
            f
        } else if self.options.shared {
            0
        } else {
            fopen::KEEP_CACHE
        };
        if flags as i32 & libc::O_ACCMODE == libc::O_WRONLY {
            // A write-only open's writes go straight to us, one request per write(2).
            // Through the page cache, a write that starts inside a page an earlier write
            // left partly written (tar's 10 KiB records: each after a file's first) is
            // sent as two requests, and each write(2) first asks for security.capability
            // (file_remove_privs, tar's and cp's alike), which direct writes leave to
            // us (KILLPRIV_V2: `drop_privileges` on every write). Nothing is lost: a
            // write-only open cannot read or map the file, the kernel writes back and
            // drops the range's cached pages around each direct write (mapped readers
            // through other opens included: DIRECT_IO_ALLOW_MMAP), and the written
            // bytes are in this mount's open file state for the next read. Without
            // PARALLEL_DIRECT_WRITES, so the inode stays out of the kernel's uncached
            // io mode and other opens may still map it.
            f |= fopen::DIRECT_IO;
        }
        // fuse_flush returns at once for such an open (we never ask for writeback cache):
        // no FLUSH at close(2). Safe for what FLUSH does here: the data it would commit is
        // committed by the last RELEASE (`last_release`), and until then reads, opens and
        // getattr of this mount find it in the open file's state; POSIX locks are the
        // kernel's own on a volume, released at close without us; a shared mapping's
        // dirty pages are written back when it is unmapped (fuse_vma_close), before that
        // RELEASE. What is lost is close(2) reporting a failed commit.
        if !self.options.flush_on_close {
            f |= fopen::NOFLUSH;
        }
        f
    }

    fn truncate(&self, req: &Request, ino: u64, size: u64) -> Result<(), Errno> {
        let state = self.open_state(req, ino)?;
        let result = state.truncate(&self.data, &*self.store, size, now_ns());
        if let Some(last) = self.open.release(ino) {
            self.last_release(last);
        }
        self.reap(result?);
        Ok(())
    }
}

/// Builds entry answers on the committer's thread.
#[derive(Clone)]
struct EntryTemplate {
    entry_timeout: Duration,
    attr_timeout: Duration,
    pending_atimes: Arc<atime::PendingAtimes>,
}

impl EntryTemplate {
    fn fill(&self, rec: &InodeRec) -> abi::EntryOut {
        let (ev, evn) = split_duration(self.entry_timeout);
        let (av, avn) = split_duration(self.attr_timeout);
        let mut rec = rec.clone();
        self.pending_atimes.overlay(&mut rec);
        abi::EntryOut {
            nodeid: rec.ino,
            generation: 0,
            entry_valid: ev,
            entry_valid_nsec: evn,
            attr_valid: av,
            attr_valid_nsec: avn,
            attr: to_attr(&rec),
        }
    }
}

/// Directories report this size (as ext4's one block), so that SEEK_DATA on one finds data.
const DIR_SIZE_BYTES: u64 = 4096;

/// The kernel's view of an inode record.
fn to_attr(rec: &InodeRec) -> abi::Attr {
    let split = |t: i64| {
        (
            t.div_euclid(1_000_000_000) as u64,
            t.rem_euclid(1_000_000_000) as u32,
        )
    };
    let (atime, atimensec) = split(rec.atime_ns);
    let (mtime, mtimensec) = split(rec.mtime_ns);
    let (ctime, ctimensec) = split(rec.ctime_ns);
    let size = if rec.is_dir() {
        DIR_SIZE_BYTES
    } else {
        rec.size
    };
    abi::Attr {
        ino: rec.ino,
        size,
        blocks: size.div_ceil(512),
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: rec.mode,
        nlink: rec.nlink,
        uid: rec.uid,
        gid: rec.gid,
        rdev: rec.rdev,
        blksize: 4096,
        ..Default::default()
    }
}

fn split_duration(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// Makes everything committed so far durable: the commits that released blocks, or the
/// state in which no chunk refers to them, must survive a power loss before the blocks are
/// deleted, or the database could come back referring to a deleted block.
fn sync_before_deleting(store: &dyn MetaStore) -> bool {
    match wait(|done| store.sync(done)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "volume: syncing the metadata before deleting blocks: {} (they stay until the next try)",
                errno_name(e)
            );
            false
        }
    }
}

/// Deletes the blocks that sessions which ended without unmounting (kill -9, a crash) wrote
/// but never committed: a block is stored before the change that refers to it.
fn recover_crashed_blocks(store: &dyn MetaStore, data: &DataPath, crashed: Vec<u64>) {
    // What this session's start found (and WAL recovery replayed) may not be on the disk yet.
    if crashed.is_empty() || !sync_before_deleting(store) {
        return;
    }
    for session in crashed {
        let lo = session << crate::file::BLOCK_ID_SESSION_SHIFT;
        let hi = (session + 1) << crate::file::BLOCK_ID_SESSION_SHIFT;
        let (stored, used) = match (
            data.blocks.list(Some(session)),
            store.blocks_between(lo, hi),
        ) {
            (Ok(stored), Ok(used)) => (stored, used),
            (Err(e), _) => {
                tracing::warn!(
                    "volume: listing the blocks of ended session {session}: {e} (fsck will)"
                );
                continue;
            }
            (_, Err(e)) => {
                tracing::warn!(
                    "volume: blocks of ended session {session}: {} (fsck will)",
                    errno_name(e)
                );
                continue;
            }
        };
        let used: std::collections::HashSet<u64> = used.into_iter().collect();
        let unused: Vec<u64> = stored.into_iter().filter(|b| !used.contains(b)).collect();
        if !unused.is_empty() {
            tracing::info!(
                "volume: deleting {} blocks that ended session {session} wrote but never committed",
                unused.len()
            );
        }
        for b in unused {
            if let Err(e) = data.blocks.delete(b) {
                tracing::warn!("volume: deleting block {b:016x}: {e} (fsck will)");
            }
        }
    }
}

/// The reaper: makes the commits that released blocks durable, gives the blocks up (deleted;
/// those that new blocks replaced may be kept as spares for new blocks to be written over:
/// `DataPath::release_block`), then forgets their gc rows (a batch of whatever was queued
/// meanwhile shares one sync). Spares are deleted once it idled for `SPARES_IDLE`, and at
/// the end.
fn reap(store: Arc<dyn MetaStore>, data: Arc<DataPath>, rx: Receiver<ReapMsg>) {
    let mut stopping = false;
    while !stopping {
        let mut blocks = Vec::new();
        let mut replaced = Vec::new();
        let mut ended = Vec::new();
        let first = match rx.recv_timeout(SPARES_IDLE) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => {
                data.drop_spares();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        for msg in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match msg {
                ReapMsg::Blocks(b) => blocks.extend(b),
                ReapMsg::Replaced(b) => replaced.extend(b),
                ReapMsg::EndedSessions(s) => ended.extend(s),
                ReapMsg::Stop => stopping = true,
            }
        }
        recover_crashed_blocks(&*store, &data, ended);
        if (blocks.is_empty() && replaced.is_empty()) || !sync_before_deleting(&*store) {
            continue;
        }
        let mut gone = Vec::with_capacity(blocks.len() + replaced.len());
        let freed = blocks.into_iter().map(|b| (b, data.blocks.delete(b)));
        let replaced = replaced.into_iter().map(|b| (b, data.release_block(b)));
        for (b, result) in freed.chain(replaced) {
            match result {
                Ok(()) => gone.push(b),
                Err(e) => tracing::warn!("volume: deleting block {b:016x}: {e} (gc will retry)"),
            }
        }
        if let Err(e) = wait(|done| store.forget_blocks(gone, done)) {
            tracing::warn!("volume: forgetting deleted blocks: {}", errno_name(e));
        }
    }
    data.drop_spares();
}

fn time_of(
    now: i64,
    valid: u32,
    now_flag: u32,
    set_flag: u32,
    secs: u64,
    nsecs: u32,
) -> Option<i64> {
    if valid & now_flag != 0 {
        Some(now)
    } else if valid & set_flag != 0 {
        Some(secs as i64 * 1_000_000_000 + nsecs as i64)
    } else {
        None
    }
}

impl Filesystem for VolumeFs {
    fn init(&self, _offered: u64) -> InitRequest {
        // Locks: on a shared volume ours (the database's), so they hold across mounts; on a
        // volume one mount holds, the kernel's, which are exact there and cost no request.
        // POSIX locks are released by FLUSH at close(2): with --no-flush-on-close none
        // comes, so they stay the kernel's (exact on this mount only), as on the passthrough.
        let mut locks = 0;
        if self.options.shared {
            locks |= init_flags::FLOCK_LOCKS;
            if self.options.flush_on_close {
                locks |= init_flags::POSIX_LOCKS;
            }
        }
        InitRequest {
            // HANDLE_KILLPRIV_V2: set-ID bits and capabilities are ours to drop (`setid`).
            // POSIX_ACL: the kernel checks permissions with the ACLs it reads through
            // getxattr (and caches); a new inode's ACL and mode (DONT_MASK: the umask comes
            // beside the mode), the mode an access ACL implies and the ACL a chmod implies
            // are ours (`acl`), and SETXATTR_EXT says when setting an ACL drops set-group-ID.
            want: init_flags::DO_READDIRPLUS
                | init_flags::READDIRPLUS_AUTO
                | init_flags::HANDLE_KILLPRIV_V2
                | init_flags::POSIX_ACL
                | init_flags::DONT_MASK
                | init_flags::SETXATTR_EXT
                | locks,
            max_stack_depth: 0,
        }
    }

    fn interrupt(&self, unique: u64) {
        self.locks.interrupt(unique)
    }

    fn getlk(&self, req: &Request, ino: u64, arg: &abi::LkIn, reply: Reply) {
        let lock = locks::lock_req(ino, arg);
        match self.store.lock_conflict(req.queue, &lock) {
            Ok(holder) => reply.lock(&locks::lock_out(&lock, holder)),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(&self, req: &Request, ino: u64, arg: &abi::LkIn, sleep: bool, reply: Reply) {
        let lock = locks::lock_req(ino, arg);
        if !matches!(lock.typ, LOCK_READ | LOCK_WRITE | LOCK_UNLOCK) {
            return reply.error(libc::EINVAL);
        }
        match wait(|done| self.store.set_lock(lock.clone(), done)) {
            Ok(None) => {
                if lock.typ == LOCK_UNLOCK {
                    self.locks.released(ino);
                } else {
                    self.locks.took(&lock);
                }
                reply.ok()
            }
            Ok(Some(_)) if sleep => self.locks.wait(Waiting::of(req), lock, reply),
            Ok(Some(_)) => reply.error(libc::EAGAIN),
            Err(e) => reply.error(e),
        }
    }

    fn connected(&self, conn: &lanefs_fuse::Connection) {
        let _ = self.session_fd.set(conn.session_fd);
    }

    fn destroy(&self) {
        // Its flush in progress ends before the last ones start.
        if let Some(writeback) = self.writeback.get() {
            writeback.stop();
        }
        for state in self.open.all() {
            if let Err(e) = self.flush_state(&state) {
                tracing::error!(
                    "volume: flushing inode {} at unmount: {}",
                    state.ino,
                    errno_name(e)
                );
            }
        }
        // Changes answered before their commit commit now, while the reaper still takes
        // the blocks they release.
        if let Err(e) = wait(|done| self.store.barrier(done)) {
            tracing::error!("volume: committing at unmount: {}", errno_name(e));
        }
        self.locks.stop();
        for stop in &self.background_stops {
            let _ = stop.send(());
        }
        // The reaper ends last: the heartbeat (whose last beat may end sessions) and the lock
        // thread first, so that what they hand the reaper is done before it stops.
        let (reaper, others): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .partition(|handle| handle.thread().name() == Some(REAPER_THREAD));
        for handle in others {
            let _ = handle.join();
        }
        if self.options.shared {
            // Unmounting: this session's unheld orphans go now, the grace cut short (another
            // mount that opened one in the last ORPHAN_GRACE and has not polled yet loses
            // it); held ones pass to a holder at the session's end.
            let _ = wait(|done| {
                sweep_orphans(&*self.store, &self.open, &self.reaper, i64::MAX, || {
                    done(Ok(()))
                })
            });
        }
        let _ = self.reaper.send(ReapMsg::Stop);
        for handle in reaper {
            let _ = handle.join();
        }
        self.store.close();
        self.lock.release();
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let mut counters: Vec<(String, u64)> = [
            ("flush_errors", &self.flush_errors),
            ("flush_waits", &self.flush_waits),
            ("dirty_cap_waits", &self.dirty_cap_waits),
            ("writeback_flushes", &self.writeback_flushes),
        ]
        .into_iter()
        .map(|(name, n)| (name.to_owned(), n.load(Ordering::Relaxed)))
        .collect();
        counters.extend(
            self.data
                .counters()
                .into_iter()
                .map(|(name, n)| (name.to_owned(), n)),
        );
        counters.extend(
            self.dirops
                .counters()
                .into_iter()
                .map(|(name, n)| (name.to_string(), n)),
        );
        counters
    }

    fn lookup(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        if name.len() > NAME_MAX {
            return reply.error(libc::ENAMETOOLONG);
        }
        let (queue, name) = (req.queue, name.to_owned());
        self.with_lease_waits(reply, move |fs, reply| {
            let found = fs.pending_atimes.read(|| {
                fs.store
                    .lookup(queue, parent, name.as_bytes())
                    .map(|rec| fs.entry_out(&rec))
            });
            match found {
                Ok(out) => reply.ok().entry(&out),
                Err(libc::ENOENT) => {
                    // A negative entry the kernel may cache for the entry timeout.
                    let (ev, evn) = split_duration(fs.options.entry_timeout);
                    reply.ok().entry(&abi::EntryOut {
                        entry_valid: ev,
                        entry_valid_nsec: evn,
                        ..Default::default()
                    })
                }
                Err(e) => reply.error(e),
            }
        })
    }

    fn getattr(&self, req: &Request, ino: u64, _fh: Option<u64>, reply: Reply) {
        // The store's record with this mount's pending atime over it.
        let read = || {
            self.store
                .getattr(req.queue, ino)
                .map(|r| self.attr_out(&r))
        };
        match self.pending_atimes.read(read) {
            Ok(out) => reply.attr(&out),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(&self, req: &Request, ino: u64, arg: &abi::SetattrIn, reply: Reply) {
        let now = now_ns();
        let valid = arg.valid;
        if let Err(e) = self.fileattrs.may_setattr(ino, valid) {
            return reply.error(e);
        }
        if valid & fattr::SIZE != 0 {
            match self.store.getattr(req.queue, ino) {
                Ok(rec) if rec.is_dir() => return reply.error(libc::EISDIR),
                Ok(rec) if !rec.is_reg() => return reply.error(libc::EINVAL),
                Ok(_) => {}
                Err(e) => return reply.error(e),
            }
            if arg.size > crate::file::MAX_FILE_BYTES {
                return reply.error(libc::EFBIG);
            }
            let unprivileged = valid & fattr::KILL_SUIDGID != 0;
            if let Err(e) = self.drop_privileges(req, ino, setid::Change::Data { unprivileged }) {
                return reply.error(e);
            }
            if let Err(e) = self.truncate(req, ino, arg.size) {
                return reply.error(e);
            }
        }
        let mode_valid = valid & fattr::MODE != 0;
        let others =
            fattr::MODE | fattr::UID | fattr::GID | fattr::ATIME | fattr::MTIME | fattr::CTIME;
        if valid & others == 0 {
            return self.getattr(req, ino, None, reply);
        }
        let old = match self.store.getattr(req.queue, ino) {
            Ok(rec) => rec,
            Err(e) => return reply.error(e),
        };
        let chown = valid & (fattr::UID | fattr::GID) != 0;
        let mode = if mode_valid {
            Some((old.mode & libc::S_IFMT) | (arg.mode & 0o7777))
        } else if chown {
            // The kernel leaves a chown's set-ID bits to us (HANDLE_KILLPRIV_V2).
            let kept = setid::mode_after(req, old.mode, old.gid, setid::Change::Owner);
            (kept != old.mode).then_some(kept)
        } else {
            None
        };
        if mode.is_some() || chown {
            self.forget_privileges(ino);
        }
        if chown && let Err(e) = self.drop_capability(req, ino) {
            return reply.error(e);
        }
        let change = AttrChange {
            mode,
            uid: (valid & fattr::UID != 0).then_some(arg.uid),
            gid: (valid & fattr::GID != 0).then_some(arg.gid),
            atime_ns: time_of(
                now,
                valid,
                fattr::ATIME_NOW,
                fattr::ATIME,
                arg.atime,
                arg.atimensec,
            ),
            mtime_ns: time_of(
                now,
                valid,
                fattr::MTIME_NOW,
                fattr::MTIME,
                arg.mtime,
                arg.mtimensec,
            ),
            ctime_ns: if valid & fattr::CTIME != 0 {
                arg.ctime as i64 * 1_000_000_000 + arg.ctimensec as i64
            } else {
                now
            },
        };
        // A chown was checked by the kernel (default_permissions); the set-ID bits it drops
        // are in `mode` above.
        if let Some(state) = self.open.get(ino)
            && change.mtime_ns.is_some()
        {
            // An explicit mtime wins over the write's (flushed later with the data): the
            // data is queued first.
            if let Err(e) = self.flush_new_early(&state, ErrorReport::Close) {
                return reply.error(e);
            }
        }
        if change.atime_ns.is_some() {
            self.pending_atimes.forget(ino);
        }
        let fs_open = self.open.clone();
        let tmpl = self.entry_template();
        let privileges_changed = (mode.is_some() || chown).then(|| self.no_privileges.clone());
        let answer_with = move |reply: LeaseReply| -> Done<InodeRec> {
            let (fs_open, tmpl, privileges_changed) =
                (fs_open.clone(), tmpl.clone(), privileges_changed.clone());
            Box::new(move |r| {
                if let Some(no_privileges) = privileges_changed {
                    no_privileges.forget(ino);
                }
                match r {
                    Ok(rec) => {
                        let mut out = tmpl.fill(&rec);
                        // As `attr`: a stale open state's size is older than the store's.
                        if let Some(state) = fs_open.get(ino)
                            && !state.stale()
                        {
                            out.attr.size = state.size();
                        }
                        reply.ok().attr(&abi::AttrOut {
                            attr_valid: out.attr_valid,
                            attr_valid_nsec: out.attr_valid_nsec,
                            attr: out.attr,
                            ..Default::default()
                        })
                    }
                    Err(e) => reply.error(e),
                }
            })
        };
        // A directory's group and set-group-ID bit are what the files created in it take,
        // and its owner and mode who may create there: another mount may be answering
        // creates there early under its lease, from its own record of the directory.
        if !(self.options.shared && old.is_dir() && (mode.is_some() || chown)) {
            let reply = LeaseReply { reply, again: None };
            return self.store.setattr(ino, change, None, answer_with(reply));
        }
        self.with_lease_waits(reply, move |fs, reply| {
            let store = fs.store.clone();
            let change = change.clone();
            fs.dirops.change_of_dir(
                ino,
                move |unleased_at_ns, done| {
                    store.setattr(ino, change.clone(), unleased_at_ns, done)
                },
                answer_with(reply),
            )
        })
    }

    fn readlink(&self, req: &Request, ino: u64, reply: Reply) {
        match self.store.readlink(req.queue, ino) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: u64, name: &OsStr, target: &OsStr, reply: Reply) {
        if target.len() > libc::PATH_MAX as usize {
            return reply.error(libc::ENAMETOOLONG);
        }
        let node = self.make_node(
            req,
            parent,
            name,
            libc::S_IFLNK | 0o777,
            0,
            0,
            Some(target.as_bytes().to_vec()),
        );
        self.reply_new_entry(node, reply)
    }

    fn mknod(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MknodIn, reply: Reply) {
        let node = self.make_node(req, parent, name, arg.mode, arg.umask, arg.rdev, None);
        self.reply_new_entry(node, reply)
    }

    fn mkdir(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MkdirIn, reply: Reply) {
        let node = self.make_node(
            req,
            parent,
            name,
            libc::S_IFDIR | (arg.mode & 0o7777),
            arg.umask,
            0,
            None,
        );
        self.reply_new_entry(node, reply)
    }

    fn unlink(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        self.remove(req.queue, parent, name, false, reply)
    }

    fn rmdir(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        self.remove(req.queue, parent, name, true, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: Reply,
    ) {
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return reply.error(libc::EINVAL);
        }
        if newname.len() > NAME_MAX {
            return reply.error(libc::ENAMETOOLONG);
        }
        let (queue, name, newname) = (req.queue, name.to_owned(), newname.to_owned());
        self.with_lease_waits(reply, move |fs, reply| {
            if let Err(e) = fs.may_rename(queue, parent, &name, newparent, &newname) {
                return reply.error(e);
            }
            let fs_reaper = fs.reaper.clone();
            fs.store.rename(
                parent,
                name.as_bytes().to_vec(),
                newparent,
                newname.as_bytes().to_vec(),
                flags,
                now_ns(),
                None,
                fs.is_open(),
                Box::new(move |r| match r {
                    Ok(renamed) => {
                        reply.ok().ok();
                        if let Some(replaced) = renamed.replaced {
                            send_reap(&fs_reaper, replaced.released);
                        }
                    }
                    Err(e) => reply.error(e),
                }),
            )
        })
    }

    fn link(&self, _req: &Request, ino: u64, newparent: u64, newname: &OsStr, reply: Reply) {
        if newname.len() > NAME_MAX {
            return reply.error(libc::ENAMETOOLONG);
        }
        if let Err(e) = self
            .fileattrs
            .may_change_entry(ino)
            .and_then(|()| self.fileattrs.may_add_to(newparent))
        {
            return reply.error(e);
        }
        let newname = newname.as_bytes().to_vec();
        self.with_lease_waits(reply, move |fs, reply| {
            let tmpl = fs.entry_template();
            let open = fs.open.clone();
            fs.store.link(
                ino,
                newparent,
                newname.clone(),
                now_ns(),
                None,
                Box::new(move |r| match r {
                    Ok(rec) => {
                        let mut out = tmpl.fill(&rec);
                        if let Some(state) = open.get(ino) {
                            // Linked again: no longer to be freed at its last close.
                            state.orphaned.store(false, Ordering::Relaxed);
                            if !state.stale() {
                                out.attr.size = state.size();
                            }
                        }
                        reply.ok().entry(&out)
                    }
                    Err(e) => reply.error(e),
                }),
            )
        })
    }

    fn open(&self, req: &Request, ino: u64, arg: &abi::OpenIn, reply: Reply) {
        let (req, flags) = (*req, arg.flags);
        self.with_lease_waits(reply, move |fs, reply| {
            match fs.open_file(&req, ino, flags) {
                Ok(out) => reply.ok().open(&out),
                Err(e) => reply.error(e),
            }
        })
    }

    fn create(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::CreateIn, reply: Reply) {
        let node = match self.make_node(
            req,
            parent,
            name,
            libc::S_IFREG | (arg.mode & 0o7777),
            arg.umask,
            0,
            None,
        ) {
            Ok(node) => node,
            Err(e) => return reply.error(e),
        };
        let flags = arg.flags;
        self.with_lease_waits(reply, move |fs, reply| {
            fs.create_and_open(node.clone(), flags, reply)
        })
    }

    fn read(&self, req: &Request, ino: u64, arg: &abi::ReadIn, reply: Reply) {
        let Some(state) = self.open.get(ino) else {
            return reply.error(libc::EBADF);
        };
        // Another mount changed the file since its view was read (the change log said so)
        // and this mount has nothing of its own over it: the view is read again first, off
        // the queue (a read of the store may wait for that mount's directory lease).
        if self.options.shared && state.stale() {
            let (queue, arg) = (req.queue, *arg);
            return self.answer_off_queue(reply, move |fs, reply| {
                let reload = || fs.store.load_file(queue, ino);
                let read = state
                    .reload(&reload)
                    .and_then(|_| state.read(&fs.data, arg.offset, arg.size, Some(&reload)));
                match read {
                    Ok(bytes) => fs.reply_read(queue, ino, arg.fh, bytes, reply),
                    Err(e) => reply.error(e),
                }
            });
        }
        // On a shared volume, another mount may have replaced blocks this mount's view of
        // the open file still names: a read that misses one reads the view again.
        let reload = || self.store.load_file(req.queue, ino);
        let reload = self.options.shared.then_some(&reload as Reload<'_>);
        match state.read(&self.data, arg.offset, arg.size, reload) {
            Ok(bytes) => self.reply_read(req.queue, ino, arg.fh, bytes, reply),
            Err(e) => reply.error(e),
        }
    }

    fn write(&self, req: &Request, ino: u64, arg: &abi::WriteIn, data: &[u8], reply: Reply) {
        let Some(state) = self.open.get(ino) else {
            return reply.error(libc::EBADF);
        };
        if let Err(e) = self.fileattrs.may_write(ino, arg.offset, state.size()) {
            return reply.error(e);
        }
        let unprivileged = arg.write_flags & abi::write_flags::KILL_SUIDGID != 0;
        if let Err(e) = self.drop_privileges(req, ino, setid::Change::Data { unprivileged }) {
            return reply.error(e);
        }
        match state.write(
            &self.data,
            arg.offset,
            data,
            self.options.parallel_writes,
            now_ns(),
        ) {
            Ok(Backpressure::None) => reply.written(data.len() as u32),
            // Past the file's dirty limit: this write waits for the flush (back-pressure),
            // off the queue.
            Ok(Backpressure::FlushFile) => {
                let written = data.len() as u32;
                self.flush_waits.fetch_add(1, Ordering::Relaxed);
                self.answer_off_queue(reply, move |fs, reply| {
                    match fs.flushed(state.flush_over_limit(&fs.data, &*fs.store)) {
                        Ok(()) => reply.written(written),
                        Err(e) => reply.error(e),
                    }
                })
            }
            // Past the mount's: it waits, off the queue, for the writeback to flush the
            // largest holders; if that takes too long (or there is no writeback thread),
            // it flushes its own file, which also reports a failing store to a writer.
            Ok(Backpressure::MountOverCap) => {
                let written = data.len() as u32;
                self.dirty_cap_waits.fetch_add(1, Ordering::Relaxed);
                self.answer_off_queue(reply, move |fs, reply| {
                    let under = fs.writeback.get().is_some_and(|writeback| {
                        writeback.wake();
                        fs.data.dirty.wait_under_cap(crate::file::DIRTY_WAIT_MAX)
                    });
                    match if under {
                        Ok(())
                    } else {
                        fs.flush_state(&state)
                    } {
                        Ok(()) => reply.written(written),
                        Err(e) => reply.error(e),
                    }
                })
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, ino: u64, arg: &abi::FlushIn, reply: Reply) {
        // A close drops the closing owner's POSIX locks on the file (the kernel keeps none
        // of a shared volume's to drop itself).
        if self.locks.forget(ino, arg.lock_owner, LockKind::Posix) {
            self.release_locks(ino, Some((arg.lock_owner, LockKind::Posix)));
        }
        let state = match self.open.get(ino) {
            Some(state) => state,
            None => return answer(reply, self.early_answer_error(ino, ErrorReport::Close)),
        };
        if let Err(e) = self.early_answer_error(ino, ErrorReport::Close) {
            return reply.error(e);
        }
        if !state.unflushed() || self.queue_new_early(&state, false) {
            return answer(reply, self.early_answer_error(ino, ErrorReport::Close));
        }
        self.answer_off_queue(reply, move |fs, reply| {
            // Off the worker a full backlog is waited for (the database's pace): the
            // synchronous way would wait for the whole backlog (2 s of commits), and a loop
            // of `echo > f` with it.
            if fs.queue_new_early(&state, true) {
                return answer(reply, fs.early_answer_error(ino, ErrorReport::Close));
            }
            answer(
                reply,
                fs.flush_state(&state)
                    .and_then(|()| fs.early_answer_error(ino, ErrorReport::Close)),
            )
        })
    }

    fn release(&self, _req: &Request, ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        self.atime_due.release(arg.fh);
        // Opens answered FOPEN_NOFLUSH had no FLUSH: commit here, while this open still
        // counts, so that the state leaves the open table only once its data is stored (an
        // open racing with this release either shares the state or reads what was stored).
        if !self.options.flush_on_close
            && let Some(state) = self.open.get(ino)
            && let Err(e) = self.flush_new_early(&state, ErrorReport::Peek)
        {
            tracing::error!(
                "volume: committing inode {} at close: {}",
                ino,
                errno_name(e)
            );
        }
        // The last open's bytes that came after its FLUSH (a shared mapping written after
        // close(2): munmap writes the pages back between the FLUSH and this RELEASE) are
        // flushed while the open still counts, as above: once the state leaves the open
        // table, an open from another CPU would make a new one from the record without them
        // (zeros to an O_DIRECT read, and a chunk its own writes would store over them).
        if let Some(state) = self.open.get(ino)
            && state.opens.load(Ordering::Relaxed) == 1
            && state.unflushed()
            && let Err(e) = self.flush_state(&state)
        {
            tracing::error!(
                "volume: flushing inode {ino} at its last close: {}",
                errno_name(e)
            );
        }
        if arg.release_flags & abi::RELEASE_FLOCK_UNLOCK != 0
            && self.locks.forget(ino, arg.lock_owner, LockKind::Flock)
        {
            self.release_locks(ino, Some((arg.lock_owner, LockKind::Flock)));
        }
        // OFD locks taken through this open (their owner is the open: the kernel sends no
        // unlock for them, see `locks`).
        for owner in self.locks.forget_handle(ino, arg.fh) {
            self.release_locks(ino, Some((owner, LockKind::Posix)));
        }
        // The last close of a file whose chunks gathered slices (a log fsync'd in small
        // pieces): compacted off the queue before the state leaves the open table, so that an
        // open meanwhile shares it (and sees the compaction). The application's close
        // returned already (RELEASE is asynchronous). Not on a shared volume: another mount
        // may be adding slices to a chunk this mount would rewrite from its own view.
        if !self.options.shared
            && let Some(state) = self.open.get(ino)
            && state.opens.load(Ordering::Relaxed) == 1
            && state.fragmented(crate::file::COMPACT_AT_CLOSE_SLICES)
        {
            return self.answer_off_queue(reply, move |fs, reply| {
                match state.compact(&fs.data, &*fs.store, crate::file::COMPACT_AT_CLOSE_SLICES) {
                    Ok(released) => fs.reap_replaced(released),
                    Err(e) => tracing::warn!(
                        "volume: compacting inode {ino} at its last close: {} (its next flush of those chunks will)",
                        errno_name(e)
                    ),
                }
                fs.release_open(ino);
                reply.ok()
            });
        }
        self.release_open(ino);
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: u64, _arg: &abi::FsyncIn, reply: Reply) {
        // The flush syncs the file's new blocks before committing their rows (every flush
        // does, so blocks of earlier flushes are durable too), and commits them durably:
        // the WAL's fsync at that commit covers it and every commit before it. With nothing
        // to flush, a sync does the same for what was committed before.
        self.answer_off_queue(reply, move |fs, reply| {
            let flushed = match fs.open.get(ino) {
                Some(state) => fs.flush_state_with(&state, true),
                None => Ok(false),
            };
            let result = flushed.and_then(|durable| match durable {
                true => Ok(()),
                false => wait(|done| fs.store.sync(done)),
            });
            answer(
                reply,
                result.and_then(|()| fs.early_answer_error(ino, ErrorReport::Sync)),
            )
        })
    }

    fn opendir(&self, req: &Request, ino: u64, _arg: &abi::OpenIn, reply: Reply) {
        match self.store.getattr(req.queue, ino) {
            Ok(rec) if !rec.is_dir() => return reply.error(libc::ENOTDIR),
            Ok(_) => {}
            Err(e) => return reply.error(e),
        }
        let fh = self.dirs.next.fetch_add(1, Ordering::Relaxed);
        self.dirs.shard(fh).insert(fh, Arc::new(Mutex::new(None)));
        reply.open(&abi::OpenOut {
            fh,
            ..Default::default()
        })
    }

    fn readdir(&self, req: &Request, ino: u64, arg: &abi::ReadIn, plus: bool, reply: Reply) {
        let (queue, arg) = (req.queue, *arg);
        self.with_lease_waits(reply, move |fs, reply| {
            fs.list(queue, ino, &arg, plus, reply)
        })
    }

    fn releasedir(&self, _req: &Request, _ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        self.dirs.shard(arg.fh).remove(&arg.fh);
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, ino: u64, _arg: &abi::FsyncIn, reply: Reply) {
        self.answer_off_queue(reply, move |fs, reply| {
            answer(
                reply,
                wait(|done| fs.store.sync(done))
                    .and_then(|()| fs.early_answer_error(ino, ErrorReport::Sync)),
            )
        })
    }

    fn syncfs(&self, _req: &Request, _ino: u64, reply: Reply) {
        // Every open file's data into blocks (durable) and rows, then one fsync of the WAL
        // for all of them and everything committed before.
        self.answer_off_queue(reply, |fs, reply| {
            let flushed = fs
                .open
                .all()
                .iter()
                .try_for_each(|state| fs.flush_state(state));
            answer(
                reply,
                flushed.and_then(|()| wait(|done| fs.store.sync(done))),
            )
        })
    }

    fn statfs(&self, _req: &Request, _ino: u64, reply: Reply) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let at = self.usage_at_ms.load(Ordering::Relaxed);
        if at == u64::MAX || now_ms.saturating_sub(at) >= USAGE_REFRESH.as_millis() as u64 {
            if let Ok(usage) = self.store.usage() {
                self.usage_inodes.store(usage.inodes, Ordering::Relaxed);
                self.usage_bytes.store(usage.bytes, Ordering::Relaxed);
            }
            self.usage_at_ms.store(now_ms, Ordering::Relaxed);
        }
        let usage = Usage {
            inodes: self.usage_inodes.load(Ordering::Relaxed),
            bytes: self.usage_bytes.load(Ordering::Relaxed),
        };
        const BSIZE: u64 = 4096;
        // Without a capacity, the data directory's file system's figures (blocks and inodes);
        // a remote store has no figures, so it shows REMOTE_CAPACITY_BYTES.
        let host = match &self.data_dir {
            Some(dir) => host_statvfs(dir).unwrap_or_default(),
            None => HostStatfs::default(),
        };
        let capacity = match &self.data_dir {
            Some(_) => self.options.capacity,
            None => Some(self.options.capacity.unwrap_or(REMOTE_CAPACITY_BYTES)),
        };
        let (blocks, free) = match capacity {
            Some(capacity) => {
                let blocks = capacity / BSIZE;
                (blocks, blocks.saturating_sub(usage.bytes.div_ceil(BSIZE)))
            }
            None => (host.total_bytes / BSIZE, host.avail_bytes / BSIZE),
        };
        let (files, ffree) = match host.files {
            0 => (
                usage.inodes + FILES_FREE_WITHOUT_LIMIT,
                FILES_FREE_WITHOUT_LIMIT,
            ),
            n => (n, host.files_free),
        };
        reply.statfs(&abi::Kstatfs {
            blocks,
            bfree: free,
            bavail: free,
            files,
            ffree,
            bsize: BSIZE as u32,
            frsize: BSIZE as u32,
            namelen: NAME_MAX as u32,
            ..Default::default()
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
        reply: Reply,
    ) {
        if name.len() > NAME_MAX || name.is_empty() {
            return reply.error(libc::ERANGE);
        }
        if value.len() > XATTR_VALUE_MAX {
            return reply.error(libc::E2BIG);
        }
        if !xattr_name_stored(name.as_bytes()) {
            return reply.error(libc::EOPNOTSUPP);
        }
        if let Err(e) = self.fileattrs.may_change_entry(ino) {
            return reply.error(e);
        }
        if name.as_bytes() == setid::CAPABILITY_XATTR {
            // Before the commit: a GETXATTR from here on reads the store.
            if let Some(state) = self.open.get(ino) {
                state.capability_absent.store(false, Ordering::SeqCst);
            }
        }
        let set = XattrSet {
            name: name.as_bytes().to_vec(),
            value: value.to_vec(),
            flags,
            kill_sgid: setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0
                && name.as_bytes() == acl::ACCESS_XATTR,
        };
        // An access ACL may drop the set-group-ID bit.
        let inherited = name.as_bytes() == acl::DEFAULT_XATTR || set.kill_sgid;
        let name = name.as_bytes().to_vec();
        self.change_xattr(
            req.queue,
            ino,
            name,
            inherited,
            reply,
            move |store, unleased_at_ns, done| {
                store.setxattr(ino, set.clone(), unleased_at_ns, done)
            },
        )
    }

    fn getxattr(&self, req: &Request, ino: u64, name: &OsStr, size: u32, reply: Reply) {
        if name.as_bytes() == FILEATTR_XATTR {
            return reply.error(libc::ENODATA);
        }
        // The kernel's question before the first write to a file this mount created
        // (file_remove_privs): answered without the store when the answer is known.
        if name.as_bytes() == setid::CAPABILITY_XATTR
            && self
                .open
                .get(ino)
                .is_some_and(|state| state.capability_absent.load(Ordering::SeqCst))
        {
            return reply.error(libc::ENODATA);
        }
        // cp -a and tar ask every file they read for its ACL and xattrs, `ls -l` every
        // file it lists for its SELinux label and ACL.
        if self.xattrs_absent(ino) {
            return reply.error(libc::ENODATA);
        }
        match self.xattr_names(req.queue, ino) {
            Ok(names) if !names.iter().any(|n| n == name.as_bytes()) => {
                return reply.error(libc::ENODATA);
            }
            Ok(_) => {}
            Err(e) => return reply.error(e),
        }
        match self.store.getxattr(req.queue, ino, name.as_bytes()) {
            Ok(value) if size == 0 => reply.xattr_size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(libc::ERANGE),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, req: &Request, ino: u64, size: u32, reply: Reply) {
        let names = if self.xattrs_absent(ino) {
            Ok(Arc::from(Vec::new()))
        } else {
            self.xattr_names(req.queue, ino)
        };
        match names {
            Ok(names) => {
                let mut list = Vec::new();
                // As natively, only CAP_SYS_ADMIN (root here) sees trusted.* names.
                let shown = |n: &&Vec<u8>| req.uid == 0 || !n.starts_with(b"trusted.");
                for n in names.iter().filter(shown) {
                    list.extend_from_slice(n);
                    list.push(0);
                }
                if size == 0 {
                    reply.xattr_size(list.len() as u32)
                } else if list.len() > size as usize {
                    reply.error(libc::ERANGE)
                } else {
                    reply.data(&list)
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, req: &Request, ino: u64, name: &OsStr, reply: Reply) {
        if !xattr_name_stored(name.as_bytes()) {
            return reply.error(libc::EOPNOTSUPP);
        }
        if let Err(e) = self.fileattrs.may_change_entry(ino) {
            return reply.error(e);
        }
        let inherited = name.as_bytes() == acl::DEFAULT_XATTR;
        let name = name.as_bytes().to_vec();
        self.change_xattr(
            req.queue,
            ino,
            name.clone(),
            inherited,
            reply,
            move |store, at_ns, done| store.removexattr(ino, name.clone(), at_ns, done),
        )
    }

    fn fallocate(&self, req: &Request, ino: u64, arg: &abi::FallocateIn, reply: Reply) {
        let Some(state) = self.open.get(ino) else {
            return reply.error(libc::EBADF);
        };
        if let Err(e) = self.fileattrs.may_fallocate(ino, arg.mode) {
            return reply.error(e);
        }
        // The kernel's file_modified leaves this to us under HANDLE_KILLPRIV_V2 and does not
        // say whether the caller has CAP_FSETID: uid 0 stands for it.
        let unprivileged = req.uid != 0;
        if let Err(e) = self.drop_privileges(req, ino, setid::Change::Data { unprivileged }) {
            return reply.error(e);
        }
        let mode = arg.mode as i32;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => false,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            libc::FALLOC_FL_ZERO_RANGE => true,
            _ => return reply.error(libc::EOPNOTSUPP),
        };
        let range = crate::file::Fallocate {
            offset: arg.offset,
            len: arg.length,
            zero,
            keep_size,
        };
        match state.fallocate(&self.data, &*self.store, range, now_ns()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn tmpfile(&self, req: &Request, parent: u64, arg: &abi::CreateIn, reply: Reply) {
        let node = match self.make_node(
            req,
            parent,
            OsStr::new(""),
            libc::S_IFREG | (arg.mode & 0o7777),
            arg.umask,
            0,
            None,
        ) {
            Ok(node) => node,
            Err(e) => return reply.error(e),
        };
        let rec = match wait(|done| self.store.create(node, done)) {
            Ok(rec) => rec,
            Err(e) => return reply.error(e),
        };
        match self.open_state(req, rec.ino) {
            Ok(state) => {
                state.orphaned.store(true, Ordering::Relaxed);
                reply.create(&self.entry_out(&rec), &self.open_out(&rec, arg.flags))
            }
            Err(e) => reply.error(e),
        }
    }

    fn lseek(&self, _req: &Request, ino: u64, arg: &abi::LseekIn, reply: Reply) {
        let Some(state) = self.open.get(ino) else {
            return reply.error(libc::EBADF);
        };
        match arg.whence as i32 {
            libc::SEEK_DATA | libc::SEEK_HOLE => match state.seek(arg.offset, arg.whence as i32) {
                Ok(pos) => reply.lseek(pos),
                Err(e) => reply.error(e),
            },
            // The kernel answers SEEK_SET/CUR/END itself; anything else is invalid.
            _ => reply.error(libc::EINVAL),
        }
    }

    fn ioctl(&self, req: &Request, ino: u64, arg: &abi::IoctlIn, data: &[u8], reply: Reply) {
        self.fileattr_ioctl(req, ino, arg, data, reply)
    }
}

fn send_reap(tx: &Sender<ReapMsg>, blocks: Vec<u64>) {
    if !blocks.is_empty() {
        let _ = tx.send(ReapMsg::Blocks(blocks));
    }
}

/// What statfs says when the data directory's file system has no inode limit.
const FILES_FREE_WITHOUT_LIMIT: u64 = 1 << 32;
/// The size statfs shows for a volume whose blocks are remote (S3 has no capacity to ask
/// for) when the mount gives none: 1 PiB, so that tools that check free space go ahead.
const REMOTE_CAPACITY_BYTES: u64 = 1 << 50;

#[derive(Default)]
struct HostStatfs {
    total_bytes: u64,
    avail_bytes: u64,
    files: u64,
    files_free: u64,
}

/// statvfs of the file system holding `path`.
fn host_statvfs(path: &std::path::Path) -> Option<HostStatfs> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(HostStatfs {
        total_bytes: st.f_blocks * st.f_frsize,
        avail_bytes: st.f_bavail * st.f_frsize,
        files: st.f_files,
        files_free: st.f_ffree,
    })
}

/// Namespaces of xattrs the volume stores; of `system.`, only the two POSIX ACLs.
const XATTR_NAMESPACES: &[&[u8]] = &[b"user.", b"trusted.", b"security."];

fn xattr_name_stored(name: &[u8]) -> bool {
    XATTR_NAMESPACES.iter().any(|ns| name.starts_with(ns)) || acl::is_acl(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{CHUNK_BYTES, DataPath, FileState};
    use crate::meta::{NewNode, ROOT_INO};
    use crate::sqlite::SqliteStore;
    use crate::volume;

    /// A formatted volume in a temp dir; removed when dropped.
    struct Dir {
        dir: std::path::PathBuf,
        db: std::path::PathBuf,
    }

    impl Dir {
        fn new(tag: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("lanefs-fs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let db = dir.join("v.db");
            volume::format(&db, &dir.join("data"), false).unwrap();
            Dir { dir, db }
        }

        /// A session on the volume, as a mount opens it.
        fn open(&self) -> (Arc<SqliteStore>, Arc<DataPath>) {
            let (_, settings) = volume::check(&self.db, true).unwrap();
            let blocks = volume::open_blocks(&self.db, &settings).unwrap();
            let store = Arc::new(SqliteStore::open(&self.db, "test", "/none", 1).unwrap());
            let data = Arc::new(DataPath::new(blocks, store.session, true, None));
            (store, data)
        }

        /// The session's heartbeat: a sync writes it (its time), nothing else here does.
        fn last_sync_ns(&self, session: u64) -> i64 {
            let conn = crate::sqlite::connect(&self.db, false).unwrap();
            conn.query_row(
                "SELECT heartbeat_ns FROM sessions WHERE id = ?",
                [session as i64],
                |r| r.get(0),
            )
            .unwrap()
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A file of two chunks, flushed: its blocks are stored and committed.
    fn flushed_file(store: &SqliteStore, data: &DataPath, name: &str) -> FileState {
        let rec = wait(|done| {
            store.create(
                NewNode {
                    ino: None,
                    parent: ROOT_INO,
                    name: name.as_bytes().to_vec(),
                    mode: libc::S_IFREG | 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    target: None,
                    now_ns: 1,
                    lease_expires_ns: None,
                    unleased_at_ns: None,
                    xattrs: Vec::new(),
                    inherit: None,
                },
                done,
            )
        })
        .unwrap();
        let file = FileState::new(rec.ino, data.dirty.clone());
        file.load(|| store.load_file(0, rec.ino)).unwrap();
        file.write(data, 0, &vec![7u8; 2 * CHUNK_BYTES as usize], true, 2)
            .unwrap();
        file.flush(data, store).unwrap();
        file
    }

    fn block_exists(data: &DataPath, block: u64) -> bool {
        data.blocks.get(block).is_ok()
    }

    /// The reaper deletes a released block only after a sync made the commit that released
    /// it durable.
    #[test]
    fn the_reaper_syncs_the_releasing_commit_before_deleting() {
        let dir = Dir::new("reap");
        let (store, data) = dir.open();
        let file = flushed_file(&store, &data, "f");
        // A whole chunk rewritten: a new block, the old one released (a small rewrite
        // would be a slice, releasing nothing).
        file.write(&data, 0, &vec![8u8; CHUNK_BYTES as usize], true, 3)
            .unwrap();
        let released = file.flush(&data, &*store).unwrap();
        assert_eq!(released.len(), 1);
        let released_at = now_ns();
        let (tx, rx) = channel();
        tx.send(ReapMsg::Blocks(released.clone())).unwrap();
        tx.send(ReapMsg::Stop).unwrap();
        let (s, d) = (store.clone() as Arc<dyn MetaStore>, data.clone());
        std::thread::spawn(move || reap(s, d, rx)).join().unwrap();
        assert!(
            !block_exists(&data, released[0]),
            "the block was not deleted"
        );
        assert!(
            dir.last_sync_ns(store.session) >= released_at,
            "the released block was deleted with no sync after the commit that released it"
        );
        store.close();
    }

    /// A mount deletes the uncommitted blocks of a crashed session only after a sync made
    /// the state it read durable.
    #[test]
    fn reclaiming_a_crashed_sessions_blocks_syncs_first() {
        let dir = Dir::new("reclaim");
        let (crashed, crashed_data) = dir.open();
        let file = flushed_file(&crashed, &crashed_data, "kept");
        // A block stored whose commit never came (the session "dies" here: never closed).
        let stray = (crashed.session << crate::file::BLOCK_ID_SESSION_SHIFT) + 1000;
        crashed_data
            .blocks
            .put(
                vec![(stray, bytes::Bytes::from_static(b"stray"))],
                Vec::new(),
            )
            .unwrap();
        let (store, data) = dir.open();
        assert_eq!(store.crashed_sessions(), vec![crashed.session]);
        let started = now_ns();
        recover_crashed_blocks(&*store, &data, store.crashed_sessions());
        assert!(
            !block_exists(&data, stray),
            "the stray block was not deleted"
        );
        let kept = store.load_file(0, file.ino).unwrap().chunks;
        assert!(kept.iter().all(|c| block_exists(&data, c.block)));
        assert!(
            dir.last_sync_ns(store.session) >= started,
            "a crashed session's blocks were deleted before this session's start was durable"
        );
        store.close();
        crashed.close();
    }
}
