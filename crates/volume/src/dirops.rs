//! Asynchronous directory operations (seed 003, issue 15): create, mknod, mkdir and symlink
//! with an inode number from a range the store delegated to this mount, and unlink and rmdir,
//! are answered before they commit; the store's committer commits them in the background, in
//! batches, in the order they were answered. On a volume that one mount holds (SQLite) in
//! every directory; on a shared one (PostgreSQL) in the directories whose lease this mount
//! holds (see `leases`), and this mount recalls another's lease before it changes, lists or
//! looks up a name in that mount's leased directories, or opens a file made there.
//!
//! `AsyncDirops` is a [`MetaStore`] over the real one. Its overlay holds what the answered,
//! uncommitted changes did, and every read looks there first:
//! - `names`: (directory, name) → the inode the name now holds, or none (removed);
//! - `inodes`: the attributes an inode has after its pending changes (a new inode's own, a
//!   directory's mtime, ctime and link count), and how many changes are pending on it.
//!
//! Why the answers are exact. The kernel holds a directory's lock exclusively across every
//! change of its names (create, unlink, rename, link…), so the checks made here before
//! answering (is the name free, is the directory empty) cannot race with another change of
//! the same names: an answered change is in the overlay, a synchronous one has committed.
//! On a shared volume the directory's lease keeps other mounts' changes out of it meanwhile.
//! The committer applies changes in the order they were queued (one queue, FIFO), so a
//! change's checks at commit time see what the answer assumed, and a crash leaves a prefix
//! of the answered changes: never a name without its inode, nor an inode in a directory
//! that was not there. An overlay entry goes once its change committed (its completion runs
//! after the commit), so a read that misses the overlay finds the change in the database.
//! Reads that the overlay cannot answer (a listing, a link's target, xattrs, a file's
//! chunks) of an inode with pending changes first wait for them (`barrier`).
//!
//! What is kept synchronous: anything whose answer the overlay cannot predict: unlink of a
//! file with other names or open here (its link count and orphan state), rmdir of a
//! directory that is not known empty, a create over a name the database holds, O_TMPFILE,
//! rename, link, and on a shared volume every change in a directory whose lease this mount
//! does not hold. Those take the store's normal path: they commit after every change
//! answered before them, and answer after.
//!
//! Errors. A change that fails at commit (the disk filled, the database went away) was
//! answered already: its inode and its directory are marked; the first close of the file
//! after the failure returns the error, and fsync (fsyncdir for the directory) returns it
//! until one of them did (`take_error`); it is logged with the name and
//! counted (`lanefs stats`: async_dirop_errors), and the kernel is told to forget the name.
//! fsync and syncfs wait for every change answered before them (the store's sync is queued
//! behind them), so what fsync acknowledged survives a crash.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::acl;
use crate::leases::{
    Held, LEASE_COOLDOWN, LeaseUse, Leases, RECALL_AGAIN, RECALL_POLL, RECALL_WAIT_MAX,
};
use crate::meta::*;

/// What an operation run by `deferring_lease_waits` answers when it met another mount's
/// live lease that it would have to wait for (before it changed anything): the file system
/// runs the request again from the offload pool, where the wait (up to `LEASE_TTL` for a
/// dead holder) holds no queue. Negative: no errno; never sent to the kernel.
pub const WAIT_OFF_QUEUE: Errno = -1;

thread_local! {
    /// Set while a queue's worker runs a request that can be run again elsewhere.
    static DEFER_LEASE_WAITS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `op` with waits for other mounts' leases answered `WAIT_OFF_QUEUE` instead
/// (`defer`), or waited for (a job of the offload pool, which may run on the very worker
/// that deferred it when the pool is full).
pub fn deferring_lease_waits<T>(defer: bool, op: impl FnOnce() -> T) -> T {
    /// Puts the thread's setting back also when `op` panics: the engine catches a
    /// request's panic and its worker goes on serving, where a setting left on would
    /// answer `WAIT_OFF_QUEUE` to requests that cannot run again.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFER_LEASE_WAITS.set(self.0);
        }
    }
    let _restore = Restore(DEFER_LEASE_WAITS.replace(defer));
    op()
}

/// Shards of the overlay's two maps.
const SHARDS: usize = 16;
/// How many times a change made outside this mount's leases runs again after another mount
/// took a lease it needs since its recall (`run_unleased`): each try recalled them first, so
/// more means mounts taking them back as soon as they are let go, which the cooldown after
/// a recall keeps rare.
const UNLEASED_TRIES_MAX: usize = 16;
/// Reads of a name that raced with a commit, tried again before waiting for the committer.
const RACED_READS_MAX: usize = 3;
/// Names held in the listings of the directories this mount made (`Listing`), all
/// together: past it a listing that would grow is dropped (its directory's names are read
/// from the store again). About 64 MiB at most.
const LISTED_NAMES_MAX: usize = 1 << 20;
/// On a shared volume, where a lookup in the store is a round trip, the names of a
/// directory this mount holds the lease of are read from the store into a listing at every
/// this many of them looked up there under that lease without one (a create or an unlink
/// looks its name up first, the kernel's LOOKUP before it another time): the next creates
/// there are answered from memory.
const LISTING_READ_AFTER_LOOKUPS: u32 = 16;
/// ...unless the directory holds more names than this: its lookups go on to the store for
/// as long as the lease holds.
const LISTING_READ_MAX: usize = 1 << 16;

/// What the file system lends the overlay: whether an inode is open on this mount (without
/// marking it, unlike `IsOpen`), where released blocks go, and how the kernel forgets a
/// name whose change failed after it was answered. Set once, after the mount started.
pub struct Hooks {
    pub open_here: Box<dyn Fn(u64) -> bool + Send + Sync>,
    pub reap: Box<dyn Fn(Vec<u64>) + Send + Sync>,
    /// Has the kernel drop the name (when given) in directory `ino`, and `ino`'s attributes
    /// (answered early by a change that then failed).
    pub forget: Box<dyn Fn(u64, Option<Vec<u8>>) + Send + Sync>,
}

/// A name's state after its pending changes.
struct PendingName {
    /// The change that set it: only that change's completion removes the entry.
    seq: u64,
    /// The inode the name holds; None: removed.
    ino: Option<u64>,
}

/// An inode's state after its pending changes.
struct PendingInode {
    rec: InodeRec,
    /// Changes pending on it (as the new inode, or as the directory of a name).
    ops: u32,
    /// Created by this mount with an early answer: it had no xattrs then, and unless `stale`
    /// its predicted attributes are exact (also once the create committed).
    created: bool,
    /// Born with xattrs (an inherited ACL): its xattrs are read from the store.
    born_with_xattrs: bool,
    /// Its create has not committed yet (one of `ops`).
    creation_pending: bool,
    /// Every change pending on it is one of a name in it (as a directory): none changes
    /// its xattrs, so they are read from the store without waiting for the committer (a
    /// create reads its directory's default ACL; behind a backlog of changes on a slow
    /// database, a wait for the committer there held every create back for the backlog).
    names_only: bool,
    /// A synchronous change was queued on it meanwhile: `rec` may be behind the database's
    /// future state, so reads wait for the committer instead of answering from it.
    stale: bool,
}

pub(crate) struct Shards<K, V> {
    /// Each mutex protects one shard's map; held for a map operation only, never two at
    /// once, never across a store call. Leaf locks.
    pub(crate) shards: Vec<Mutex<HashMap<K, V>>>,
}

impl<K, V> Shards<K, V> {
    pub(crate) fn new() -> Self {
        Shards {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    pub(crate) fn shard(&self, by: u64) -> MutexGuard<'_, HashMap<K, V>> {
        self.shards[(by as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// The complete set of a directory's names, which this mount knows because it made the
/// directory (answered early) and every change of its names since went through here, so
/// that a lookup or the free-name check of a create there needs no read of the store (on a
/// shared volume also one read from the store: `list_from_store`). A create or a remove
/// that takes the store's synchronous path updates it once committed (`listing_follows`);
/// a rename or a link there, or a change that fails at its commit, drops it. On a shared
/// volume it is valid only under the lease it was made under.
struct Listing {
    names: HashMap<Vec<u8>, u64>,
    under: Option<Arc<Held>>,
}

/// The next range of delegated inode numbers, asked for ahead of need.
#[derive(Default)]
struct SpareRange {
    asked: bool,
    /// [start, end), once its grab committed.
    range: Option<(u64, u64)>,
}

/// The error of a change answered early that failed at its commit.
#[derive(Clone, Copy)]
struct FailedChange {
    errno: Errno,
    /// A new inode's: it never came to be, so every fsync and close of it fails.
    sticky: bool,
    /// A close returned it already (the next fsync still does).
    closed_with: bool,
}

/// Who asks for an inode's failed change (see `AsyncDirops::take_error`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ErrorReport {
    /// A close (FLUSH, or RELEASE without FLUSH) or a request acting on an open file: the
    /// first one after the failure returns it.
    Close,
    /// fsync or fsyncdir: returns it until one of them did (that one takes it).
    Sync,
    /// A RELEASE, which has nobody to tell: sees it, takes nothing.
    Peek,
}

/// The overlay and the store under it (see the module's comment).
pub struct AsyncDirops {
    /// For the completions of changes answered early (they run on the committer).
    me: Weak<AsyncDirops>,
    inner: Arc<dyn MetaStore>,
    enabled: bool,
    /// (directory, name) → the name's pending state; sharded by directory.
    names: Shards<(u64, Vec<u8>), PendingName>,
    /// ino → the inode's pending state; sharded by inode.
    inodes: Shards<u64, PendingInode>,
    /// Delegated inode numbers not handed out yet: [next, end). Held while a new range is
    /// taken (a commit, once per `ops::INODE_RANGE` creates); a leaf otherwise.
    delegated: Mutex<(u64, u64)>,
    /// The next range, asked for in the background once half of the current one is handed
    /// out (a range grab queues behind every change answered so far, which under a steady
    /// stream of creates takes as long as the committer's backlog). A leaf lock, taken
    /// inside `delegated` or alone.
    spare: Arc<Mutex<SpareRange>>,
    /// Numbers the changes of the overlay (`PendingName::seq`).
    seq: AtomicU64,
    /// Bumped after an `inodes` entry goes: a read that missed the overlay and raced with a
    /// commit sees it move and reads again.
    settled: AtomicU64,
    /// Errnos of changes that failed after they were answered, by inode (see `take_error`);
    /// sharded by inode.
    errors: Shards<u64, FailedChange>,
    /// Entries in `errors`: fsync and close skip the shards while it is 0.
    errors_waiting: AtomicU64,
    /// Changes answered before their commit, and those that then failed (`lanefs stats`).
    answered_early: AtomicU64,
    failed: AtomicU64,
    /// Changes that waited for their commit because the store's backlog had no room and
    /// none came (`backlog_has_room`: the database stuck or gone, the intent log full).
    held_back: AtomicU64,
    hooks: OnceLock<Hooks>,
    /// dir → its complete listing (see `Listing`); sharded by directory.
    listings: Shards<u64, Listing>,
    /// Names in `listings`, all together (bounded by `LISTED_NAMES_MAX`).
    listed_names: AtomicUsize,
    /// Bumped, per shard of `listings`, before a listing is forgotten: a listing read from
    /// the store (`list_from_store`) while one of its shard's was forgotten is not kept
    /// (the forget may be of its directory, which a failed commit changed meanwhile).
    unlisted: [AtomicU64; SHARDS],
    /// Listings read from the store (`lanefs stats`: listings_read).
    listings_read: AtomicU64,
    /// A shared volume's directory leases (see `leases`): the ones this mount holds, and
    /// the others', which it recalls before changing or listing their directories (also
    /// when it answers nothing early itself). None where one mount holds the volume.
    leases: Option<Leases>,
}

impl AsyncDirops {
    /// `enabled`: answer eligible changes early; otherwise every call goes straight through
    /// (on a `shared` volume, after any other mount's lease on the directory is recalled).
    pub fn new(inner: Arc<dyn MetaStore>, enabled: bool, shared: bool) -> Arc<AsyncDirops> {
        Arc::new_cyclic(|me| AsyncDirops {
            me: me.clone(),
            inner,
            enabled,
            names: Shards::new(),
            inodes: Shards::new(),
            delegated: Mutex::new((0, 0)),
            spare: Arc::new(Mutex::new(SpareRange::default())),
            seq: AtomicU64::new(1),
            settled: AtomicU64::new(0),
            errors: Shards::new(),
            errors_waiting: AtomicU64::new(0),
            answered_early: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
            hooks: OnceLock::new(),
            listings: Shards::new(),
            unlisted: std::array::from_fn(|_| AtomicU64::new(0)),
            listings_read: AtomicU64::new(0),
            listed_names: AtomicUsize::new(0),
            leases: shared.then(Leases::default),
        })
    }

    /// Lends the file system's hooks; until then, every change is synchronous.
    pub fn set_hooks(&self, hooks: Hooks) {
        let _ = self.hooks.set(hooks);
    }

    /// Counters for `lanefs stats`.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = vec![
            ("async_dirops", self.answered_early.load(Ordering::Relaxed)),
            ("async_dirop_errors", self.failed.load(Ordering::Relaxed)),
            ("async_held_back", self.held_back.load(Ordering::Relaxed)),
            ("listings_read", self.listings_read.load(Ordering::Relaxed)),
        ];
        let backlog = self.inner.backlog();
        counters.push(("async_backlog", backlog.waiting));
        counters.push(("database_gone", backlog.database_gone as u64));
        let commits = self.inner.commit_counts();
        counters.push(("commit_batches", commits.batches));
        counters.push(("commit_wakes", commits.wakes));
        counters.push(("commit_rate", commits.rate));
        counters.push(("async_room_waits", commits.room_waits));
        counters.push(("commit_updates_unwaited", commits.updates_unwaited));
        if let Some(leases) = &self.leases {
            counters.extend(leases.counters());
        }
        counters
    }

    /// The error of a change on `ino` that failed after it was answered. A new inode's
    /// (its create failed) is returned to every fsync and close of it. Any other is
    /// returned by the first close after the failure and by fsync (fsyncdir for a
    /// directory) until one returned it: a close does not take it from fsync, because the
    /// close may be nobody's to check (a child that inherited the descriptor closes it at
    /// exec, and its FLUSH is the file's like any other), while a program that cares calls
    /// fsync, as it would to learn of the kernel's own write-back errors.
    pub fn take_error(&self, ino: u64, by: ErrorReport) -> Option<Errno> {
        if self.errors_waiting.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut errors = self.errors.shard(ino);
        let failed = errors.get_mut(&ino)?;
        let errno = failed.errno;
        if failed.sticky {
            return Some(errno);
        }
        match by {
            ErrorReport::Peek => Some(errno),
            ErrorReport::Close if failed.closed_with => None,
            ErrorReport::Close => {
                failed.closed_with = true;
                Some(errno)
            }
            ErrorReport::Sync => {
                errors.remove(&ino);
                self.errors_waiting.fetch_sub(1, Ordering::AcqRel);
                Some(errno)
            }
        }
    }

    /// The hooks when a change may be answered before its commit now: on a mount that
    /// does, while the store's backlog has room; with it full, after waiting for some
    /// (`wait_for_room`: a create or a remove, or a close's commit of a new file's bytes
    /// once off its queue's worker; a setattr's, on the worker, takes the synchronous way at
    /// once). Else the change waits for its commit, and is counted.
    fn active(&self, wait_for_room: bool) -> Option<&Hooks> {
        let hooks = self.hooks.get().filter(|_| self.enabled)?;
        match self.inner.backlog_has_room(wait_for_room) {
            Some(true) => Some(hooks),
            Some(false) => {
                self.held_back.fetch_add(1, Ordering::Relaxed);
                None
            }
            // Full, and not waited for here: a close tries again off its worker, waiting.
            None => None,
        }
    }

    /// Whether a change on a queue's worker (under `deferring_lease_waits`) must leave it
    /// before `active`, which would wait there for room in a full backlog (up to a second
    /// of the queue's other requests): it answers `WAIT_OFF_QUEUE` and runs again from the
    /// offload pool.
    fn backlog_wait_off_queue(&self) -> bool {
        DEFER_LEASE_WAITS.get()
            && self.enabled
            && self.hooks.get().is_some()
            && self.inner.backlog_has_room(false).is_none()
    }

    /// Waits until every change queued so far has committed or failed.
    fn settle(&self) {
        let _ = wait(|done| self.inner.barrier(done));
    }

    /// Whether `ino` has changes pending; with its predicted attributes when they can be
    /// trusted.
    fn pending(&self, ino: u64) -> Option<Option<InodeRec>> {
        let inodes = self.inodes.shard(ino);
        inodes.get(&ino).map(|p| (!p.stale).then(|| p.rec.clone()))
    }

    /// Whether `ino` was created by a pending change and has had only changes answered
    /// early since (its predicted attributes exact; a setxattr goes the synchronous way and
    /// marks it stale).
    fn created_exactly(&self, ino: u64) -> bool {
        self.enabled
            && self
                .inodes
                .shard(ino)
                .get(&ino)
                .is_some_and(|p| p.created && !p.stale)
    }

    /// Whether `ino` is `created_exactly` and was born without xattrs: then it has none
    /// (what chown's capability check and tar's and cp's xattr probes ask).
    fn known_without_xattrs(&self, ino: u64) -> bool {
        self.enabled
            && self
                .inodes
                .shard(ino)
                .get(&ino)
                .is_some_and(|p| p.created && !p.stale && !p.born_with_xattrs)
    }

    /// Waits for the committer if `ino` has changes pending (before a read the overlay
    /// cannot answer).
    fn settle_if_pending(&self, ino: u64) {
        if self.enabled && self.pending(ino).is_some() {
            self.settle();
        }
    }

    /// Whether a change pending on `ino` may change its xattrs (see
    /// `PendingInode::names_only`).
    fn xattrs_pending(&self, ino: u64) -> bool {
        self.enabled
            && self
                .inodes
                .shard(ino)
                .get(&ino)
                .is_some_and(|p| !p.names_only)
    }

    /// Waits for the committer before a read of `ino`'s xattrs if a pending change may
    /// change them.
    fn settle_if_xattrs_pending(&self, ino: u64) {
        if self.xattrs_pending(ino) {
            self.settle();
        }
    }

    /// Marks an inode a synchronous change is about to change: its predicted attributes
    /// are no longer to be answered from.
    pub(crate) fn mark_stale(&self, ino: u64) {
        if !self.enabled {
            return;
        }
        if let Some(p) = self.inodes.shard(ino).get_mut(&ino) {
            p.stale = true;
        }
    }

    /// An inode's attributes: predicted, or (settled first when the prediction is stale)
    /// the database's.
    fn current(&self, queue: usize, ino: u64) -> Result<InodeRec, Errno> {
        match self.pending(ino) {
            Some(Some(rec)) => Ok(rec),
            Some(None) => {
                self.settle();
                self.inner.getattr(queue, ino)
            }
            None => self.inner.getattr(queue, ino),
        }
    }

    /// The next delegated inode number; None when no range could be taken.
    fn next_ino(&self) -> Option<u64> {
        let mut range = self.delegated.lock().unwrap_or_else(|e| e.into_inner());
        if range.0 >= range.1 {
            let spare = self
                .spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .range
                .take();
            match spare {
                Some(taken) => *range = taken,
                None => match wait(|done| self.inner.delegate_inodes(done)) {
                    Ok(taken) => *range = taken,
                    Err(e) => {
                        tracing::warn!(
                            "volume: taking inode numbers for early answers: errno {e}; creates wait for their commit meanwhile"
                        );
                        return None;
                    }
                },
            }
            self.spare.lock().unwrap_or_else(|e| e.into_inner()).asked = false;
            // The next is asked for as soon as this one is in use: a whole range of
            // creates' time to commit. (Asked for at half a range, it came too late wherever
            // a batch takes longer than 512 creates: on a slow database every create then
            // waited for it.)
            self.ask_for_spare_range();
        }
        let ino = range.0;
        range.0 += 1;
        Some(ino)
    }

    /// Asks for the next range in the background, once per range.
    fn ask_for_spare_range(&self) {
        {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if spare.asked || spare.range.is_some() {
                return;
            }
            spare.asked = true;
        }
        let spare = self.spare.clone();
        self.inner.delegate_inodes(Box::new(move |taken| {
            let mut spare = spare.lock().unwrap_or_else(|e| e.into_inner());
            match taken {
                Ok(taken) => spare.range = Some(taken),
                // Taken waiting once the range in use runs out.
                Err(_) => spare.asked = false,
            }
        }));
    }

    /// What `name` in `parent` holds by what this mount knows without the store: a pending
    /// change of the name, else the directory's listing. Some(Some(ino)), Some(None) for no
    /// such name; None: ask the store.
    fn known_name(&self, parent: u64, name: &[u8]) -> Option<Option<u64>> {
        let pending = self
            .names
            .shard(parent)
            .get(&(parent, name.to_vec()))
            .map(|p| p.ino);
        pending.or_else(|| self.listed(parent, name))
    }

    /// `known_name`, with `parent`'s listing read from the store when it is time to
    /// (`list_from_store`). Only for a change of `name`: see there.
    fn known_or_listed_name(&self, queue: usize, parent: u64, name: &[u8]) -> Option<Option<u64>> {
        self.known_name(parent, name).or_else(|| {
            self.list_from_store(queue, parent)?;
            self.listed(parent, name)
        })
    }

    /// What `name` in `parent` holds: Some(Some(rec)), Some(None) for no such name, None when
    /// it could not be read.
    fn resolve(&self, queue: usize, parent: u64, name: &[u8]) -> Option<Option<InodeRec>> {
        match self.known_or_listed_name(queue, parent, name) {
            Some(None) => Some(None),
            Some(Some(ino)) => self.current(queue, ino).ok().map(Some),
            None => match self.inner.lookup(queue, parent, name) {
                Ok(rec) => Some(Some(rec)),
                Err(libc::ENOENT) => Some(None),
                Err(_) => None,
            },
        }
    }

    /// Records a change answered early on its directory: the name's new state and the
    /// directory's predicted attributes (`base`: the directory as it was read).
    fn record(
        &self,
        parent: u64,
        base: InodeRec,
        name: &[u8],
        ino: Option<u64>,
        now_ns: i64,
        nlink_delta: i64,
    ) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut inodes = self.inodes.shard(parent);
            let dir = inodes.entry(parent).or_insert(PendingInode {
                rec: base,
                ops: 0,
                created: false,
                born_with_xattrs: false,
                creation_pending: false,
                names_only: true,
                stale: false,
            });
            dir.ops += 1;
            dir.rec.mtime_ns = now_ns;
            dir.rec.ctime_ns = now_ns;
            dir.rec.nlink = (dir.rec.nlink as i64 + nlink_delta).max(0) as u32;
        }
        self.list_change(parent, name, ino);
        // The name last: a reader that finds it finds the inode's entry too.
        self.names
            .shard(parent)
            .insert((parent, name.to_vec()), PendingName { seq, ino });
        self.answered_early.fetch_add(1, Ordering::Relaxed);
        seq
    }

    /// A change answered early committed (or `failed`): its entries go (the name first, so
    /// a reader never finds a name whose inode entry is gone before the database has both).
    fn settled_change(
        &self,
        parent: u64,
        name: &[u8],
        seq: u64,
        created: Option<u64>,
        failed: bool,
    ) {
        {
            let mut names = self.names.shard(parent);
            let key = (parent, name.to_vec());
            if names.get(&key).is_some_and(|p| p.seq == seq) {
                names.remove(&key);
            }
        }
        if failed {
            // Again, now that the name is out of the overlay: a listing read from the store
            // after `failed_change` forgot it may have taken the failed change from the
            // overlay as done (`list_from_store`).
            self.forget_listing(parent);
        }
        if let Some(ino) = created
            && let Some(p) = self.inodes.shard(ino).get_mut(&ino)
        {
            // What is still pending on it is changes in it or of it, never its creation:
            // an rmdir must not take it for empty (see `early_remove`).
            p.creation_pending = false;
        }
        for ino in created.into_iter().chain([parent]) {
            self.settle_inode(ino);
        }
    }

    /// A change answered early failed at commit: marks its inode and directory for fsync and
    /// close, counts and logs it, and has the kernel forget the name.
    fn failed_change(&self, what: &str, parent: u64, name: &[u8], ino: Option<u64>, e: Errno) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            "volume: {what} of {:?} in directory inode {parent}, answered before its commit, failed at the commit: {}; fsync and close of the file and of the directory return the error",
            String::from_utf8_lossy(name),
            std::io::Error::from_raw_os_error(e)
        );
        self.note_error(parent, e, false);
        self.forget_listing(parent);
        if let Some(ino) = ino {
            self.note_error(ino, e, true);
            self.forget_listing(ino);
        }
        if let Some(hooks) = self.hooks.get() {
            (hooks.forget)(parent, Some(name.to_vec()));
        }
    }

    /// What `name` in `dir` holds by this mount's listing of `dir`: Some(Some(ino)),
    /// Some(None) for no such name; None without a valid listing (read the store).
    fn listed(&self, dir: u64, name: &[u8]) -> Option<Option<u64>> {
        self.with_listing(dir, |listing| listing.names.get(name).copied())
    }

    /// Whether this mount's valid listing of `dir` is empty: every name made there has been
    /// removed (by changes queued, in order, before anything queued after this).
    fn listed_empty(&self, dir: u64) -> bool {
        self.with_listing(dir, |listing| listing.names.is_empty()) == Some(true)
    }

    /// `f` of `dir`'s listing if it is valid (made under the lease held now); an invalid one
    /// is dropped.
    fn with_listing<R>(&self, dir: u64, f: impl FnOnce(&Listing) -> R) -> Option<R> {
        let under = match &self.leases {
            Some(leases) => Some(leases.valid_held(dir, self.inner.volume_now_ns())?),
            None => None,
        };
        let mut listings = self.listings.shard(dir);
        let listing = listings.get(&dir)?;
        let same_lease = match (&under, &listing.under) {
            (Some(now), Some(made)) => Arc::ptr_eq(now, made),
            (None, None) => true,
            _ => false,
        };
        if !same_lease {
            let gone = listings.remove(&dir);
            drop(listings);
            self.unlist(gone);
            return None;
        }
        Some(f(listing))
    }

    /// Starts the (empty) listing of a directory this mount just made.
    fn list_new_directory(&self, dir: u64) {
        if self.listed_names.load(Ordering::Relaxed) >= LISTED_NAMES_MAX {
            return;
        }
        let under = match &self.leases {
            Some(leases) => match leases.valid_held(dir, self.inner.volume_now_ns()) {
                Some(held) => Some(held),
                None => return,
            },
            None => None,
        };
        let listing = Listing {
            names: HashMap::new(),
            under,
        };
        self.listings.shard(dir).insert(dir, listing);
    }

    /// An early change of `name` in `dir` (now naming `ino`, or removed), in its listing.
    fn list_change(&self, dir: u64, name: &[u8], ino: Option<u64>) {
        let mut listings = self.listings.shard(dir);
        let Some(listing) = listings.get_mut(&dir) else {
            return;
        };
        match ino {
            Some(_) if self.listed_names.load(Ordering::Relaxed) >= LISTED_NAMES_MAX => {
                let gone = listings.remove(&dir);
                drop(listings);
                self.unlist(gone);
            }
            Some(ino) => {
                if listing.names.insert(name.to_vec(), ino).is_none() {
                    self.listed_names.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                if listing.names.remove(name).is_some() {
                    self.listed_names.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Drops `dir`'s listing (a change of its names that this overlay does not follow).
    fn forget_listing(&self, dir: u64) {
        self.unlisted[dir as usize % SHARDS].fetch_add(1, Ordering::AcqRel);
        let gone = self.listings.shard(dir).remove(&dir);
        self.unlist(gone);
    }

    /// `done` of a create or a remove in `dir` that waits for its commit (held back, or
    /// not to be answered early), wrapped so that `dir`'s listing follows it: once it
    /// committed, before it is answered (the kernel holds `dir`'s lock until then),
    /// `follow(answer)`; a failure (but for `WAIT_OFF_QUEUE`, which changed nothing)
    /// forgets the listing. A create held back by a full backlog in the middle of an untar
    /// would otherwise cost every create after it in the directory its lookups, and each
    /// rmdir of an `rm -rf` a read of its parent's names.
    fn listing_follows<T: 'static>(
        &self,
        dir: u64,
        done: Done<T>,
        follow: impl FnOnce(&AsyncDirops, &T) + Send + 'static,
    ) -> Done<T> {
        let this = self.me.clone();
        Box::new(move |r| {
            if let Some(this) = this.upgrade() {
                match &r {
                    Ok(answer) => follow(&this, answer),
                    Err(WAIT_OFF_QUEUE) => {}
                    Err(_) => this.forget_listing(dir),
                }
            }
            done(r)
        })
    }

    /// Reads `dir`'s names from the store into its listing, under the lease this mount
    /// holds on it, the `LISTING_READ_AFTER_LOOKUPS`th time a name there is looked up in the
    /// store under that lease; Some(()) when it did. Called only by a change of a name in
    /// `dir`, which holds the kernel's lock of `dir` exclusively, so that no other change
    /// of its names runs meanwhile (a LOOKUP may run without that lock: the kernel's
    /// revalidation of a cached name takes none, so one may not read a listing): the names
    /// are the store's overlaid with the changes pending there, which were taken before the
    /// read (one that commits meanwhile is in both, the same). A commit that fails forgets
    /// the listing, also one being read (`unlisted`). Another mount changes nothing there
    /// while the lease holds.
    fn list_from_store(&self, queue: usize, dir: u64) -> Option<()> {
        let leases = self.leases.as_ref()?;
        let held = leases.valid_held(dir, self.inner.volume_now_ns())?;
        if !held.store_lookup_lists(LISTING_READ_AFTER_LOOKUPS)
            || self.listed_names.load(Ordering::Relaxed) >= LISTED_NAMES_MAX
        {
            return None;
        }
        let unlisted = &self.unlisted[dir as usize % SHARDS];
        let unlisted_before = unlisted.load(Ordering::Acquire);
        let pending: Vec<(Vec<u8>, Option<u64>)> = self
            .names
            .shard(dir)
            .iter()
            .filter(|((parent, _), _)| *parent == dir)
            .map(|((_, name), p)| (name.clone(), p.ino))
            .collect();
        let Some(mut names) = self.inner.names_in(queue, dir, LISTING_READ_MAX).ok()? else {
            held.set_unlistable();
            return None;
        };
        for (name, ino) in pending {
            match ino {
                Some(ino) => names.insert(name, ino),
                None => names.remove(&name),
            };
        }
        let count = names.len();
        let mut listings = self.listings.shard(dir);
        if listings.contains_key(&dir) || unlisted.load(Ordering::Acquire) != unlisted_before {
            return None;
        }
        // Counted under the shard's lock, as `unlist` discounts a removed one.
        self.listed_names.fetch_add(count, Ordering::Relaxed);
        listings.insert(
            dir,
            Listing {
                names,
                under: Some(held),
            },
        );
        drop(listings);
        self.listings_read.fetch_add(1, Ordering::Relaxed);
        Some(())
    }

    fn unlist(&self, gone: Option<Listing>) {
        if let Some(gone) = gone {
            self.listed_names
                .fetch_sub(gone.names.len(), Ordering::Relaxed);
        }
    }

    /// Whether the bytes of a small file this mount created in `dir` may commit after its
    /// close returned: while changes are answered early, and on a shared volume while this
    /// mount holds `dir`'s lease (held until the commit is queued): another mount's open of
    /// the file recalls that lease first (`load_file`), so the bytes are committed before it
    /// reads them (close-to-open).
    /// `wait_for_room`: as `active`'s (a caller off its queue's worker may wait).
    pub fn lease_for_data_of(&self, dir: u64, wait_for_room: bool) -> Option<LeaseUse> {
        self.active(wait_for_room)?;
        match &self.leases {
            None => Some(LeaseUse::unneeded()),
            Some(leases) => leases.use_held(dir, self.inner.volume_now_ns()),
        }
    }

    /// Starts an early answer of a change in `dir`: under the lease this mount holds on it,
    /// taking the lease first if nobody else holds it (a shared volume); None: answer after
    /// the commit.
    fn use_lease(&self, dir: u64) -> Option<LeaseUse> {
        let Some(leases) = &self.leases else {
            return Some(LeaseUse::unneeded());
        };
        let now = self.inner.volume_now_ns();
        if let Some(lease) = leases.use_held(dir, now) {
            return Some(lease);
        }
        if leases.refused_recently(dir, now) {
            return None;
        }
        self.take_lease(leases, dir, now)
    }

    /// Takes `dir`'s lease, held by nobody else; None (and not tried again for a while)
    /// when another mount holds it or the take failed.
    fn take_lease(&self, leases: &Leases, dir: u64, now: i64) -> Option<LeaseUse> {
        let take = LeaseChange::Take {
            dir,
            now_ns: now,
            expires_ns: now + crate::ops::LEASE_TTL.as_nanos() as i64,
        };
        match wait(|done| self.inner.change_lease(take, done)) {
            Ok(true) => Some(leases.taken(dir, now)),
            Ok(false) => {
                leases.refuse_for_now(dir, now);
                None
            }
            Err(e) => {
                tracing::warn!(
                    "volume: taking the lease of directory inode {dir}: errno {e}; its changes wait for their commit meanwhile"
                );
                leases.refuse_for_now(dir, now);
                None
            }
        }
    }

    /// An attribute or xattr change of directory `dir` (`run(unleased_at_ns, done)`, the
    /// store's change): on a shared volume, made under this mount's lease on `dir` when it
    /// holds it, else checked against other mounts' leases on it and recalling them (see
    /// `run_unleased`): a holder answers the creates in `dir` early from its group,
    /// set-group-ID bit and default ACL, and must not answer one from the old ones after
    /// this change returned.
    pub fn change_of_dir<T: Send + 'static>(
        &self,
        dir: u64,
        run: impl Fn(Option<i64>, Done<T>),
        done: Done<T>,
    ) {
        if let Some(leases) = &self.leases
            && let Some(lease) = leases.use_held(dir, self.inner.volume_now_ns())
        {
            run(None, done);
            drop(lease);
            return;
        }
        self.run_unleased(|| self.clear_foreign_lease(dir).map(drop), run, done)
    }

    /// Before a change or a listing of `dir` that does not go under this mount's own lease:
    /// recalls another mount's live lease on it and waits until that mount has committed
    /// what it answered there and let go, or the lease expired (a dead holder, or one that
    /// never looked at the recall: a recalled lease is not renewed); whether there was one.
    /// A lease still live past `RECALL_WAIT_MAX` (the database server's clock stepped back)
    /// is EIO: going on could miss what the holder answered and has not committed. Nothing
    /// on a volume one mount holds. Under `deferring_lease_waits` a live lease found is
    /// `WAIT_OFF_QUEUE` at once.
    fn clear_foreign_lease(&self, dir: u64) -> Result<bool, Errno> {
        let Some(leases) = &self.leases else {
            return Ok(false);
        };
        if leases.holds(dir, self.inner.volume_now_ns()) {
            return Ok(false);
        }
        let deadline = std::time::Instant::now() + RECALL_WAIT_MAX;
        let mut recalled = None;
        let mut recalled_at = std::time::Instant::now();
        loop {
            let holder = match self.inner.foreign_lease(0, dir, self.inner.volume_now_ns()) {
                Ok(Some(holder)) => holder,
                // Unreadable: the change goes on; the database still checks it.
                Ok(None) | Err(_) => return Ok(recalled.is_some()),
            };
            if DEFER_LEASE_WAITS.get() {
                return Err(WAIT_OFF_QUEUE);
            }
            // Asked again now and then: a recall the holder missed must not cost the whole
            // expiry.
            if recalled != Some(holder) || recalled_at.elapsed() >= RECALL_AGAIN {
                if recalled.is_none() {
                    leases.count_wait();
                }
                recalled = Some(holder);
                recalled_at = std::time::Instant::now();
                let recall = LeaseChange::Recall { dir, holder };
                let _ = wait(|done| self.inner.change_lease(recall, done));
            }
            if std::time::Instant::now() >= deadline {
                tracing::error!(
                    "volume: session {holder}'s lease on directory inode {dir} is still live {}s after its recall, past any expiry it can have (was the database server's clock stepped back?); the operation fails with EIO",
                    RECALL_WAIT_MAX.as_secs()
                );
                return Err(libc::EIO);
            }
            std::thread::sleep(RECALL_POLL);
        }
    }

    /// A create that waits for its commit, in a directory whose lease this mount does not
    /// hold: on a shared volume its own transaction checks that no other mount holds one
    /// (one round trip less than `clear_foreign_lease` before it); see `run_unleased`.
    fn create_unleased(&self, node: NewNode, done: Done<InodeRec>) {
        let Some(leases) = &self.leases else {
            return self.inner.create(node, done);
        };
        // Under this mount's lease, used until the change is queued: a let-go queues behind.
        // Its mode and ACLs as an early create's would be (held back by a full backlog, it
        // commits under the lease, outside any check of the transaction's own).
        if let Some(lease) = leases.use_held(node.parent, self.inner.volume_now_ns()) {
            match self.inherited_under(&lease, node) {
                Ok(node) => self.inner.create(node, done),
                Err(e) => done(Err(e)),
            }
            drop(lease);
            return;
        }
        let parent = node.parent;
        self.run_unleased(
            || self.clear_foreign_lease(parent).map(drop),
            |at_ns, created| {
                let mut node = node.clone();
                node.unleased_at_ns = at_ns;
                self.inner.create(node, created)
            },
            done,
        )
    }

    /// An unlink that waits for its commit, in a directory whose lease this mount does not
    /// hold: as `create_unleased`.
    fn unlink_unleased(
        &self,
        parent: u64,
        name: Vec<u8>,
        now_ns: i64,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        if let Some(leases) = &self.leases
            && let Some(lease) = leases.use_held(parent, self.inner.volume_now_ns())
        {
            self.inner
                .remove(parent, name, false, now_ns, None, is_open, done);
            drop(lease);
            return;
        }
        self.run_unleased(
            || self.clear_foreign_lease(parent).map(drop),
            |at_ns, removed| {
                let (name, is_open) = (name.clone(), is_open.clone());
                self.inner
                    .remove(parent, name, false, now_ns, at_ns, is_open, removed)
            },
            done,
        )
    }

    /// An rmdir that waits for its commit: checked against other mounts' leases on the
    /// parent and on the directory it removes (what another mount answered in it must be
    /// committed before it is found empty or not); see `run_unleased`.
    fn rmdir_unleased(
        &self,
        parent: u64,
        name: Vec<u8>,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        if self.leases.is_none() {
            return self
                .inner
                .remove(parent, name, true, now_ns, unleased_at_ns, is_open, done);
        }
        self.run_unleased(
            || {
                self.clear_foreign_lease(parent)?;
                if let Ok(target) = self.inner.lookup(0, parent, &name)
                    && target.is_dir()
                {
                    self.clear_foreign_lease(target.ino)?;
                }
                Ok(())
            },
            |at_ns, removed| {
                let (name, is_open) = (name.clone(), is_open.clone());
                self.inner
                    .remove(parent, name, true, now_ns, at_ns, is_open, removed)
            },
            done,
        )
    }

    /// A change that waits for its commit, made on a shared volume outside this mount's
    /// leases: its transaction checks, once it holds the rows of the directories it changes,
    /// that no other mount holds a live lease on them (`ops::FOREIGN_LEASE` otherwise,
    /// changing nothing); refused, it recalls them (`clear`) and runs again. A recall
    /// before the change alone would leave a window: another mount could take a lease
    /// between the recall and the commit, and answer early a create the commit then
    /// contradicts. It waits for each commit, so on a queue's worker (under
    /// `deferring_lease_waits`) it answers `WAIT_OFF_QUEUE` before anything, and the request
    /// runs again from the offload pool: the queue's other requests would otherwise wait
    /// behind the commit, up to `--db-wait` for a database gone. On a volume one mount holds,
    /// `run(None)` once.
    fn run_unleased<T: Send + 'static>(
        &self,
        clear: impl Fn() -> Result<(), Errno>,
        run: impl Fn(Option<i64>, Done<T>),
        done: Done<T>,
    ) {
        if self.leases.is_none() {
            return run(None, done);
        }
        if DEFER_LEASE_WAITS.get() {
            return done(Err(WAIT_OFF_QUEUE));
        }
        for _ in 0..UNLEASED_TRIES_MAX {
            let at_ns = self.inner.volume_now_ns();
            match wait(|ran| run(Some(at_ns), ran)) {
                Err(crate::ops::FOREIGN_LEASE) => {
                    if let Err(e) = clear() {
                        return done(Err(e));
                    }
                }
                ran => return done(ran),
            }
        }
        tracing::error!(
            "volume: a change was refused {UNLEASED_TRIES_MAX} times in a row for other mounts' directory leases taken again after each recall; it fails with EIO"
        );
        done(Err(libc::EIO))
    }

    /// A lookup through the overlay (straight to the store when nothing is answered early
    /// here).
    fn lookup_here(&self, queue: usize, parent: u64, name: &[u8]) -> Result<InodeRec, Errno> {
        if !self.enabled {
            return self.inner.lookup(queue, parent, name);
        }
        match self.known_name(parent, name) {
            Some(None) => return Err(libc::ENOENT),
            Some(Some(ino)) => return self.current(queue, ino),
            None => {}
        }
        // Not pending: the database has the name's latest state, but the inode it names may
        // have changes pending (a directory being filled), and a commit may settle them
        // between the read and the look at the overlay.
        for _ in 0..RACED_READS_MAX {
            let settled = self.settled.load(Ordering::Acquire);
            let rec = self.inner.lookup(queue, parent, name)?;
            match self.pending(rec.ino) {
                Some(Some(predicted)) => return Ok(predicted),
                Some(None) => break,
                None if self.settled.load(Ordering::Acquire) == settled => return Ok(rec),
                None => {}
            }
        }
        self.settle();
        self.inner.lookup(queue, parent, name)
    }

    /// A lookup on a shared volume in a directory whose lease this mount does not hold and
    /// where the overlay knows nothing of the name: the name and whether another mount
    /// holds the directory's lease in one read, where `lookup_here` and
    /// `clear_foreign_lease` take two (a path walk on PostgreSQL pays one round trip a
    /// component instead of two). None when that read does not settle it (another mount's
    /// lease to recall, a commit meanwhile, an error): the caller goes the usual way.
    fn lookup_unleased(
        &self,
        queue: usize,
        parent: u64,
        name: &[u8],
    ) -> Option<Result<InodeRec, Errno>> {
        let leases = self.leases.as_ref()?;
        let now = self.inner.volume_now_ns();
        if leases.holds(parent, now) || self.known_name(parent, name).is_some() {
            return None;
        }
        let settled = self.settled.load(Ordering::Acquire);
        let (found, holder) = self
            .inner
            .lookup_and_foreign_lease(queue, parent, name, now)
            .ok()?;
        if holder.is_some() {
            return None;
        }
        // As in `lookup_here`: the inode may have changes pending, which may also have
        // settled between the read and the look at the overlay.
        match found {
            Err(e) => Some(Err(e)),
            Ok(rec) => match self.pending(rec.ino) {
                Some(Some(predicted)) => Some(Ok(predicted)),
                None if self.settled.load(Ordering::Acquire) == settled => Some(Ok(rec)),
                _ => None,
            },
        }
    }

    /// Lets go the leases other mounts recalled (after committing what was answered early
    /// under them); run every `CHANGE_POLL_INTERVAL` by the heartbeat thread.
    pub fn serve_recalls(&self) {
        let Some(leases) = &self.leases else { return };
        let recalled = match self.inner.recalled_leases() {
            Ok(recalled) if !recalled.is_empty() => recalled,
            _ => return,
        };
        leases.revoke(&recalled, false);
        let free_from_ns = Some(self.inner.volume_now_ns() + LEASE_COOLDOWN.as_nanos() as i64);
        let queued = self.let_go(leases, &recalled, free_from_ns);
        leases.count_let_go_at_recall(queued);
    }

    /// Lets go the leases not used since the last heartbeat (so that their rows, and the
    /// heartbeat's renewal, stay few).
    pub fn let_go_idle(&self) {
        let Some(leases) = &self.leases else { return };
        let idle = leases.revoke(&[], true);
        self.let_go(leases, &idle, None);
    }

    /// A directory this mount is creating (answered early): nobody else can know it before
    /// its create commits, so it holds the lease at once; the lease's expiry, for the row
    /// the create writes with the directory (None: a volume one mount holds needs none).
    fn lease_new_directory(&self, dir: u64, node: &NewNode) -> Option<i64> {
        let leases = self.leases.as_ref()?;
        let now = self.inner.volume_now_ns();
        let lease = leases.taken_with_create(dir, now);
        // Its default ACL is the one it is born with.
        if let (Some(held), Some(_)) = (lease.held(), &node.inherit) {
            let default = node
                .xattrs
                .iter()
                .find(|(name, _)| name == acl::DEFAULT_XATTR)
                .map(|(_, value)| value.clone());
            held.set_default_acl(default, 0);
        }
        drop(lease);
        Some(now + crate::ops::LEASE_TTL.as_nanos() as i64)
    }

    /// `node`, to be answered early under `lease`, with the mode and ACLs that its
    /// directory's default ACL as it is under the lease hands down (read once per lease,
    /// under it, or known from the directory's own create). The caller built them from
    /// what this mount knew of it, which may predate the lease's take and another mount's
    /// change made before it: a create that took the lease itself, or that built its inode
    /// just before another request's take, would otherwise answer, and commit, the old
    /// mode for good.
    fn inherited_under(&self, lease: &LeaseUse, node: NewNode) -> Result<NewNode, Errno> {
        let (Some(held), Some(inherit)) = (lease.held(), &node.inherit) else {
            return Ok(node);
        };
        let under = match held.default_acl() {
            Ok(known) => known,
            Err(forgets) => {
                // Through the overlay: this mount's own change of it may be pending.
                let read = match self.getxattr(0, node.parent, acl::DEFAULT_XATTR) {
                    Ok(value) => Some(value),
                    Err(libc::ENODATA) => None,
                    Err(e) => return Err(e),
                };
                held.set_default_acl(read.clone(), forgets);
                read
            }
        };
        if under == inherit.default {
            return Ok(node);
        }
        let (mode, xattrs) = acl::inherit(under.as_deref(), inherit.mode, inherit.umask);
        let inherit = Some(Inherit {
            default: under,
            ..inherit.clone()
        });
        Ok(NewNode {
            mode,
            xattrs,
            inherit,
            ..node
        })
    }

    /// `done` of a change of xattr `name` of `ino`: when it is a directory's default ACL,
    /// what this mount's lease on it knew of it goes, now and again once the change is made
    /// (a read may have come between).
    fn forgetting_leased_default_acl(&self, ino: u64, name: &[u8], done: Done<()>) -> Done<()> {
        if name != acl::DEFAULT_XATTR || self.leases.is_none() {
            return done;
        }
        self.forget_leased_default_acl(ino);
        let this = self.me.clone();
        Box::new(move |r| {
            if let Some(this) = this.upgrade() {
                this.forget_leased_default_acl(ino);
            }
            done(r)
        })
    }

    fn forget_leased_default_acl(&self, dir: u64) {
        // Whether valid or not: a heartbeat may renew it yet.
        if let Some(held) = self.leases.as_ref().and_then(|leases| leases.recorded(dir)) {
            held.forget_default_acl();
        }
    }

    /// Queues the release of the leases of `dirs` (revoked already, so no change is
    /// answered under them any more) behind every change answered so far: the queue is
    /// committed in order, so those commit first. Nothing waits for it: behind a backlog of
    /// changes on a slow database, a wait here kept the change log unread and the other
    /// mounts' recalls unserved for as long. A release queued already is not queued again;
    /// the number queued.
    fn let_go(&self, leases: &Leases, dirs: &[u64], free_from_ns: Option<i64>) -> usize {
        let mut queued = 0;
        for &dir in dirs {
            let Some(released) = leases.start_release(dir) else {
                continue;
            };
            queued += 1;
            let release = LeaseChange::Release { dir, free_from_ns };
            self.inner.change_lease(
                release,
                Box::new(move |r| {
                    released();
                    if let Err(e) = r {
                        tracing::warn!(
                            "volume: letting go the lease of directory inode {dir}: errno {e}; it expires by itself"
                        );
                    }
                }),
            );
        }
        queued
    }

    /// Queues a small file's data change without waiting for it (a close of a file just
    /// created, see `FileState::flush_early`): the inode counts as pending until it commits
    /// (an open reads the store only after); its predicted attributes, where it has them,
    /// take the new size and times, else none are answered until the commit; a failure is
    /// logged, counted and reported by the file's next fsync.
    pub fn update_data_early(
        &self,
        update: InlineUpdate,
        done: Box<dyn FnOnce(Result<(), Errno>) + Send>,
    ) {
        let ino = update.ino;
        {
            let mut inodes = self.inodes.shard(ino);
            let p = inodes.entry(ino).or_insert(PendingInode {
                rec: InodeRec::default(),
                ops: 0,
                created: false,
                born_with_xattrs: false,
                creation_pending: false,
                names_only: false,
                stale: true,
            });
            // A write may drop a file capability.
            p.names_only = false;
            p.ops += 1;
            p.rec.size = update.size;
            p.rec.mtime_ns = update.mtime_ns;
            p.rec.ctime_ns = update.ctime_ns;
        }
        self.answered_early.fetch_add(1, Ordering::Relaxed);
        let this = self.me.clone();
        self.inner.update_data_in_background(
            update,
            Box::new(move |r| {
                let Some(this) = this.upgrade() else { return };
                match r {
                    Ok(released) => {
                        done(Ok(()));
                        if let Some(hooks) = this.hooks.get() {
                            (hooks.reap)(released);
                        }
                    }
                    Err(e) => {
                        done(Err(e));
                        this.failed_inode_change(
                            "its data, committed after its close returned",
                            ino,
                            e,
                        );
                    }
                }
                this.settle_inode(ino);
            }),
        );
    }

    /// A change of `ino` answered before its commit failed there: counted, logged, and kept
    /// for the file's next fsync or close to return.
    fn failed_inode_change(&self, what: &str, ino: u64, e: Errno) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            "volume: inode {ino}: {what}, answered before its commit, failed at the commit: {}; the file's next fsync and close return the error",
            std::io::Error::from_raw_os_error(e)
        );
        self.note_error(ino, e, false);
    }

    /// One pending change of `ino` is over.
    fn settle_inode(&self, ino: u64) {
        {
            let mut inodes = self.inodes.shard(ino);
            if let Some(p) = inodes.get_mut(&ino) {
                p.ops -= 1;
                if p.ops == 0 {
                    inodes.remove(&ino);
                }
            }
        }
        self.settled.fetch_add(1, Ordering::Release);
    }

    /// Keeps a failed change's errno for the fsync or close of `ino` that reports it.
    fn note_error(&self, ino: u64, errno: Errno, sticky: bool) {
        let mut errors = self.errors.shard(ino);
        let failed = FailedChange {
            errno,
            sticky,
            closed_with: false,
        };
        match errors.insert(ino, failed) {
            // A new inode's failure outranks a later one of its data.
            Some(earlier) if earlier.sticky => {
                errors.insert(ino, earlier);
            }
            Some(_) => {}
            None => {
                self.errors_waiting.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// The attributes a create would give the new inode (as `ops::create` computes them), if
    /// it can be answered early: the parent is a directory, the name is free, and an inode
    /// number is at hand.
    fn early_create(&self, node: &NewNode) -> Option<(InodeRec, InodeRec)> {
        let parent = self.current(0, node.parent).ok()?;
        if !parent.is_dir() || parent.nlink == 0 {
            return None;
        }
        if self.resolve(0, node.parent, &node.name)?.is_some() {
            return None;
        }
        let ino = self.next_ino()?;
        let rec = node.record(ino, parent.mode, parent.gid);
        Some((parent, rec))
    }

    /// The attributes a setattr gives an inode this mount created and has not committed
    /// (its predicted attributes exact), if it can be answered early: under the lease of the
    /// inode's directory (another mount learns of the inode only through that directory,
    /// which recalls the lease first); the change counted pending on it.
    fn early_setattr(&self, ino: u64, change: &AttrChange) -> Option<(InodeRec, LeaseUse)> {
        let exact = |p: &PendingInode| p.created && !p.stale;
        if !self.created_exactly(ino) {
            return None;
        }
        let parent = self.inodes.shard(ino).get(&ino)?.rec.parent;
        let lease = self.lease_for_data_of(parent, false)?;
        let mut inodes = self.inodes.shard(ino);
        // The create may have settled meanwhile (the entry gone), or a synchronous change
        // come: then the database's state is the one to change.
        let p = inodes.get_mut(&ino).filter(|p| exact(p))?;
        // A mode changes an access ACL's mask.
        p.names_only = false;
        let rec = &mut p.rec;
        rec.mode = change.mode.unwrap_or(rec.mode);
        rec.uid = change.uid.unwrap_or(rec.uid);
        rec.gid = change.gid.unwrap_or(rec.gid);
        rec.atime_ns = change.atime_ns.unwrap_or(rec.atime_ns);
        rec.mtime_ns = change.mtime_ns.unwrap_or(rec.mtime_ns);
        rec.ctime_ns = change.ctime_ns;
        p.ops += 1;
        Some((p.rec.clone(), lease))
    }

    /// An access ACL that says no more than a mode, set on an inode this mount created
    /// and that has no xattrs: only its mode changes (see `ops::setxattr`), so it is the
    /// chmod that `cp -a` and `tar --acls` send after each create as an ACL, and goes as
    /// one (answered early like one).
    fn acl_as_chmod(&self, ino: u64, set: &XattrSet) -> Option<AttrChange> {
        if set.name != acl::ACCESS_XATTR
            || set.flags & libc::XATTR_REPLACE as u32 != 0
            || !self.known_without_xattrs(ino)
        {
            return None;
        }
        let (bits, false) = acl::mode_bits(&set.value).ok()? else {
            return None;
        };
        let mode = self.pending(ino)??.mode;
        let dropped = 0o777 | if set.kill_sgid { libc::S_ISGID } else { 0 };
        Some(AttrChange {
            mode: Some(mode & !dropped | bits),
            uid: None,
            gid: None,
            atime_ns: None,
            mtime_ns: None,
            ctime_ns: crate::now_ns(),
        })
    }

    /// Whether the remove of `name` in `parent` can be answered early: the inode, the
    /// directory as read, and for a directory to remove the use of its own lease, held until
    /// the remove is queued (so no other mount makes a name in it between the emptiness
    /// check and the queueing: its recall waits for that use, and then for the remove's
    /// commit). Another mount's lease on it was recalled before (`remove`); one taken since
    /// makes this mount's take fail, and the remove wait for its commit.
    fn early_remove(
        &self,
        parent: u64,
        name: &[u8],
        dir: bool,
        hooks: &Hooks,
    ) -> Option<(InodeRec, InodeRec, LeaseUse)> {
        let base = self.current(0, parent).ok()?;
        let Some(Some(target)) = self.resolve(0, parent, name) else {
            return None;
        };
        if target.is_dir() != dir {
            return None;
        }
        let mut emptied_lease = LeaseUse::unneeded();
        if dir {
            emptied_lease = self.use_lease(target.ino)?;
            // Empty: one whose complete listing this mount holds has no name left (the
            // removes that emptied it are queued before this one: `rm -rf` of a tree this
            // mount made waited for a commit at every directory, 2.4 ms each on
            // PostgreSQL); a directory created by a pending change with nothing pending in
            // it (its only pending change is its own creation); or one with nothing pending
            // whose stored listing is empty.
            let listed_empty = self.listed_empty(target.ino);
            let inodes = self.inodes.shard(target.ino);
            match inodes.get(&target.ino) {
                _ if listed_empty => {}
                Some(p) if !(p.creation_pending && p.ops == 1) => return None,
                Some(_) => {}
                None => {
                    drop(inodes);
                    // No names, or more than none: no attributes read.
                    if !self
                        .inner
                        .names_in(0, target.ino, 0)
                        .is_ok_and(|names| names.is_some())
                    {
                        return None;
                    }
                }
            }
        } else if target.nlink != 1 || (hooks.open_here)(target.ino) {
            return None;
        }
        Some((base, target, emptied_lease))
    }
}

impl MetaStore for AsyncDirops {
    fn lookup(&self, queue: usize, parent: u64, name: &[u8]) -> Result<InodeRec, Errno> {
        if let Some(found) = self.lookup_unleased(queue, parent, name) {
            return found;
        }
        let found = self.lookup_here(queue, parent, name);
        // Another mount holding the directory's lease may have made the name (or its
        // file's bytes, or removed it) without committing yet: after the recall it has.
        if matches!(found, Ok(_) | Err(libc::ENOENT)) && self.clear_foreign_lease(parent)? {
            return self.lookup_here(queue, parent, name);
        }
        found
    }

    fn getattr(&self, queue: usize, ino: u64) -> Result<InodeRec, Errno> {
        if !self.enabled {
            return self.inner.getattr(queue, ino);
        }
        self.current(queue, ino)
    }

    fn getattrs(&self, queue: usize, inos: &[u64]) -> Result<Vec<InodeRec>, Errno> {
        if !self.enabled {
            return self.inner.getattrs(queue, inos);
        }
        // As `current`, for each: predicted attributes where they are exact, the store's
        // record (after the pending changes settled, where some were not) otherwise.
        let mut recs = Vec::with_capacity(inos.len());
        let mut unknown = Vec::with_capacity(inos.len());
        let mut stale = false;
        for &ino in inos {
            match self.pending(ino) {
                Some(Some(rec)) => recs.push(rec),
                Some(None) => {
                    stale = true;
                    unknown.push(ino);
                }
                None => unknown.push(ino),
            }
        }
        if stale {
            self.settle();
        }
        if !unknown.is_empty() {
            recs.extend(self.inner.getattrs(queue, &unknown)?);
        }
        Ok(recs)
    }

    fn names_in(&self, queue: usize, dir: u64, max: usize) -> Result<Option<NamesIn>, Errno> {
        self.clear_foreign_lease(dir)?;
        self.settle_if_pending(dir);
        self.inner.names_in(queue, dir, max)
    }

    fn readdir(&self, queue: usize, dir: u64) -> Result<Vec<DirItem>, Errno> {
        self.clear_foreign_lease(dir)?;
        self.settle_if_pending(dir);
        if !self.enabled {
            return self.inner.readdir(queue, dir);
        }
        // A listing carries its entries' attributes (READDIRPLUS), which the kernel takes
        // as the files' own: an entry with changes pending has its predicted ones, or the
        // listing is read again once they settled. An entry with none pending when looked
        // at may have had one commit after the listing was read (a closed file's bytes:
        // the listing says size 0), so a listing read while anything settled is read again
        // (as a lookup is). After the settle, whatever was answered before this request
        // was sent is in the database, and the kernel ignores a listing's attributes for
        // an inode whose attributes it got later.
        'read: for _ in 0..RACED_READS_MAX {
            let settled = self.settled.load(Ordering::Acquire);
            let mut items = self.inner.readdir(queue, dir)?;
            for item in &mut items {
                match self.pending(item.ino) {
                    Some(Some(rec)) => item.attr = Some(rec),
                    Some(None) => break 'read,
                    None => {}
                }
            }
            if self.settled.load(Ordering::Acquire) == settled {
                return Ok(items);
            }
        }
        self.settle();
        self.inner.readdir(queue, dir)
    }

    fn readlink(&self, queue: usize, ino: u64) -> Result<Vec<u8>, Errno> {
        self.settle_if_pending(ino);
        self.inner.readlink(queue, ino)
    }

    fn getxattr(&self, queue: usize, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if self.known_without_xattrs(ino) {
            return Err(libc::ENODATA);
        }
        self.settle_if_xattrs_pending(ino);
        self.inner.getxattr(queue, ino, name)
    }

    fn listxattr(&self, queue: usize, ino: u64) -> Result<Vec<Vec<u8>>, Errno> {
        if self.known_without_xattrs(ino) {
            return Ok(Vec::new());
        }
        self.settle_if_xattrs_pending(ino);
        self.inner.listxattr(queue, ino)
    }

    fn xattr_names_of(&self, queue: usize, inos: &[u64]) -> Result<InodesXattrNames, Errno> {
        // An inode with changes pending that may change its xattrs is left out unless it
        // is known to have none.
        let mut known = Vec::new();
        let mut committed = Vec::with_capacity(inos.len());
        for &ino in inos {
            if self.known_without_xattrs(ino) {
                known.push((ino, Vec::new()));
            } else if !self.xattrs_pending(ino) {
                committed.push(ino);
            }
        }
        if !committed.is_empty() {
            known.extend(self.inner.xattr_names_of(queue, &committed)?);
        }
        Ok(known)
    }

    fn load_file(&self, queue: usize, ino: u64) -> Result<FileRec, Errno> {
        self.settle_if_pending(ino);
        let file = self.inner.load_file(queue, ino)?;
        // Another mount that made the file may not have committed its bytes yet: it has
        // once it let go of the lease of the file's directory.
        if self.clear_foreign_lease(file.attr.parent)? {
            return self.inner.load_file(queue, ino);
        }
        Ok(file)
    }

    fn usage(&self) -> Result<Usage, Errno> {
        self.inner.usage()
    }

    fn create(&self, node: NewNode, done: Done<InodeRec>) {
        if node.name.is_empty() || node.ino.is_some() {
            return self.inner.create(node, done);
        }
        if self.backlog_wait_off_queue() {
            return done(Err(WAIT_OFF_QUEUE));
        }
        let lease = self.active(true).and_then(|_| self.use_lease(node.parent));
        let node = match &lease {
            Some(lease) => match self.inherited_under(lease, node) {
                Ok(node) => node,
                Err(e) => return done(Err(e)),
            },
            None => node,
        };
        let Some((parent, rec)) = lease.as_ref().and_then(|_| self.early_create(&node)) else {
            let unleased = lease.is_none();
            drop(lease);
            let (dir, name) = (node.parent, node.name.clone());
            let done = self.listing_follows(dir, done, move |this, rec: &InodeRec| {
                this.list_change(dir, &name, Some(rec.ino))
            });
            if unleased {
                return self.create_unleased(node, done);
            }
            return self.inner.create(node, done);
        };
        let ino = rec.ino;
        self.inodes.shard(ino).insert(
            ino,
            PendingInode {
                rec: rec.clone(),
                ops: 1,
                created: true,
                born_with_xattrs: !node.xattrs.is_empty(),
                creation_pending: true,
                names_only: false,
                stale: false,
            },
        );
        let seq = self.record(
            node.parent,
            parent,
            &node.name,
            Some(ino),
            node.now_ns,
            rec.is_dir() as i64,
        );
        let lease_expires_ns = if rec.is_dir() {
            self.lease_new_directory(ino, &node)
        } else {
            None
        };
        let node = NewNode {
            ino: Some(ino),
            lease_expires_ns,
            ..node
        };
        let (dir, name) = (node.parent, node.name.clone());
        let this = self.me.clone();
        self.inner.create_in_background(
            node,
            Box::new(move |r| {
                if let Some(this) = this.upgrade() {
                    let failed = r.is_err();
                    match (r, &this.leases, lease_expires_ns) {
                        (Ok(_), Some(leases), Some(_)) => leases.row_committed(ino),
                        (Err(e), leases, expires) => {
                            this.failed_change("a create", dir, &name, Some(ino), e);
                            if let (Some(leases), Some(_)) = (leases, expires) {
                                leases.lost(ino);
                            }
                        }
                        _ => {}
                    }
                    this.settled_change(dir, &name, seq, Some(ino), failed);
                }
            }),
        );
        if rec.is_dir() {
            self.list_new_directory(ino);
        }
        // Answered only once queued: a change the kernel sends after this answer must
        // queue behind it (the committer's order is the queue's).
        done(Ok(rec));
        drop(lease);
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
        self.forget_listing(parent);
        self.mark_stale(ino);
        self.mark_stale(parent);
        if self.leases.is_none() {
            return self
                .inner
                .link(ino, parent, name, now_ns, unleased_at_ns, done);
        }
        self.run_unleased(
            || self.clear_foreign_lease(parent).map(drop),
            |at_ns, linked| {
                self.inner
                    .link(ino, parent, name.clone(), now_ns, at_ns, linked)
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
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Removed>,
    ) {
        if self.backlog_wait_off_queue() {
            return done(Err(WAIT_OFF_QUEUE));
        }
        let hooks = self.active(true);
        // Another mount's lease on a directory to remove is recalled (what it answered there
        // committed) before this mount uses its lease on the parent: a use held across that
        // wait, up to a dead holder's expiry, would hold up a recall of the parent, and the
        // upkeep thread with it. A lease held past its expiry fails here as it would on the
        // synchronous way: waiting again there would only double the caller's wait.
        if dir
            && hooks.is_some()
            && self.leases.is_some()
            && let Some(Some(target)) = self.resolve(0, parent, &name)
            && target.is_dir()
            && let Err(e) = self.clear_foreign_lease(target.ino)
        {
            return done(Err(e));
        }
        let lease = hooks.and_then(|_| self.use_lease(parent));
        let early = match (hooks, &lease) {
            // The parent's lease checked again after the checks, which may have waited for
            // the take of the lease on the directory to remove.
            (Some(hooks), Some(lease)) => self
                .early_remove(parent, &name, dir, hooks)
                .filter(|_| lease.valid_at(self.inner.volume_now_ns())),
            _ => None,
        };
        let Some((base, target, emptied_lease)) = early else {
            let removed_name = name.clone();
            let done = self.listing_follows(parent, done, move |this, removed: &Removed| {
                this.list_change(parent, &removed_name, None);
                if dir {
                    this.forget_listing(removed.ino);
                }
            });
            if dir {
                // Checked against leases on the parent too, whether or not this mount
                // holds it: its use is let go here, so as not to hold a recall of it up
                // for a commit.
                drop(lease);
                return self.rmdir_unleased(parent, name, now_ns, unleased_at_ns, is_open, done);
            }
            let Some(lease) = lease else {
                return self.unlink_unleased(parent, name, now_ns, is_open, done);
            };
            // Under this mount's lease, used until the change is queued: the let-go of a
            // recall queues behind it, and the queue commits in order.
            self.inner
                .remove(parent, name, dir, now_ns, unleased_at_ns, is_open, done);
            drop(lease);
            return;
        };
        let seq = self.record(parent, base, &name, None, now_ns, -(dir as i64));
        if dir {
            self.forget_listing(target.ino);
        }
        let this = self.me.clone();
        let what = if dir { "an rmdir" } else { "an unlink" };
        let key = name.clone();
        self.inner.remove_in_background(
            parent,
            name,
            dir,
            now_ns,
            is_open,
            Box::new(move |r| {
                if let Some(this) = this.upgrade() {
                    let failed = r.is_err();
                    match r {
                        Ok(removed) => {
                            if let Some(hooks) = this.hooks.get() {
                                (hooks.reap)(removed.released);
                            }
                        }
                        Err(e) => this.failed_change(what, parent, &key, None, e),
                    }
                    this.settled_change(parent, &key, seq, None, failed);
                }
            }),
        );
        // Answered once queued, as a create is.
        done(Ok(Removed {
            ino: target.ino,
            ..Default::default()
        }));
        drop(emptied_lease);
        drop(lease);
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
        self.forget_listing(parent);
        self.forget_listing(newparent);
        self.mark_stale(parent);
        self.mark_stale(newparent);
        if self.leases.is_none() {
            return self.inner.rename(
                parent,
                name,
                newparent,
                newname,
                flags,
                now_ns,
                unleased_at_ns,
                is_open,
                done,
            );
        }
        let clear = || {
            self.clear_foreign_lease(parent)?;
            if newparent != parent {
                self.clear_foreign_lease(newparent)?;
            }
            // A directory renamed over must be empty, with nothing answered in it
            // elsewhere.
            match self.lookup(0, newparent, &newname) {
                Ok(over) if over.is_dir() => {
                    self.clear_foreign_lease(over.ino)?;
                }
                Err(WAIT_OFF_QUEUE) => return Err(WAIT_OFF_QUEUE),
                _ => {}
            }
            Ok(())
        };
        self.run_unleased(
            clear,
            |at_ns, renamed| {
                let (name, newname, is_open) = (name.clone(), newname.clone(), is_open.clone());
                self.inner.rename(
                    parent, name, newparent, newname, flags, now_ns, at_ns, is_open, renamed,
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
        let Some((rec, lease)) = self.early_setattr(ino, &change) else {
            self.mark_stale(ino);
            return self.inner.setattr(ino, change, unleased_at_ns, done);
        };
        self.answered_early.fetch_add(1, Ordering::Relaxed);
        let this = self.me.clone();
        self.inner.setattr_in_background(
            ino,
            change,
            Box::new(move |r| {
                let Some(this) = this.upgrade() else { return };
                if let Err(e) = r {
                    this.failed_inode_change("an attribute change", ino, e);
                    // The attributes answered are not the volume's: neither this mount's
                    // prediction nor the kernel's cache is to be believed.
                    this.mark_stale(ino);
                    this.settle_inode(ino);
                    if let Some(hooks) = this.hooks.get() {
                        (hooks.forget)(ino, None);
                    }
                    return;
                }
                this.settle_inode(ino);
            }),
        );
        // Answered once queued, as a create is.
        done(Ok(rec));
        drop(lease);
    }

    fn update_data(&self, update: DataUpdate, done: Done<Vec<u64>>) {
        self.mark_stale(update.ino);
        self.inner.update_data(update, done)
    }

    fn setxattr(&self, ino: u64, set: XattrSet, unleased_at_ns: Option<i64>, done: Done<()>) {
        let done = self.forgetting_leased_default_acl(ino, &set.name, done);
        if let Some(change) = self.acl_as_chmod(ino, &set) {
            return self.setattr(
                ino,
                change,
                unleased_at_ns,
                Box::new(move |r| done(r.map(|_| ()))),
            );
        }
        self.mark_stale(ino);
        self.inner.setxattr(ino, set, unleased_at_ns, done)
    }

    fn removexattr(&self, ino: u64, name: Vec<u8>, unleased_at_ns: Option<i64>, done: Done<()>) {
        let done = self.forgetting_leased_default_acl(ino, &name, done);
        // Nothing to remove (`cp -a` removes a new directory's default ACL when its source
        // has none).
        if self.known_without_xattrs(ino) {
            return done(Err(libc::ENODATA));
        }
        self.mark_stale(ino);
        self.inner.removexattr(ino, name, unleased_at_ns, done)
    }

    fn free_orphan(&self, ino: u64, done: Done<Vec<u64>>) {
        self.inner.free_orphan(ino, done)
    }

    fn sync(&self, done: Done<()>) {
        self.inner.sync(done)
    }

    fn create_in_background(&self, node: NewNode, done: Done<InodeRec>) {
        self.inner.create_in_background(node, done)
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
        self.inner
            .remove_in_background(parent, name, dir, now_ns, is_open, done)
    }

    fn update_data_in_background(&self, update: InlineUpdate, done: Done<Vec<u64>>) {
        self.inner.update_data_in_background(update, done)
    }

    fn setattr_in_background(&self, ino: u64, change: AttrChange, done: Done<InodeRec>) {
        self.inner.setattr_in_background(ino, change, done)
    }

    fn barrier(&self, done: Done<()>) {
        self.inner.barrier(done)
    }

    fn backlog_has_room(&self, wait: bool) -> Option<bool> {
        self.inner.backlog_has_room(wait)
    }

    fn backlog(&self) -> Backlog {
        self.inner.backlog()
    }

    fn commit_counts(&self) -> CommitCounts {
        self.inner.commit_counts()
    }

    fn delegate_inodes(&self, done: Done<(u64, u64)>) {
        self.inner.delegate_inodes(done)
    }

    fn forget_blocks(&self, blocks: Vec<u64>, done: Done<()>) {
        self.inner.forget_blocks(blocks, done)
    }

    fn blocks_between(&self, lo: u64, hi: u64) -> Result<Vec<u64>, Errno> {
        self.inner.blocks_between(lo, hi)
    }

    fn volume_now_ns(&self) -> i64 {
        self.inner.volume_now_ns()
    }

    fn crashed_sessions(&self) -> Vec<u64> {
        self.inner.crashed_sessions()
    }

    fn pending_gc(&self) -> Result<Vec<u64>, Errno> {
        self.inner.pending_gc()
    }

    fn heartbeat(&self, now_ns: i64, done: Done<Beat>) {
        if self.leases.is_none() {
            return self.inner.heartbeat(now_ns, done);
        }
        let this = self.me.clone();
        self.inner.heartbeat(
            now_ns,
            Box::new(move |beat| {
                if let (Ok(beat), Some(this)) = (&beat, this.upgrade())
                    && let Some(leases) = &this.leases
                {
                    leases.renewed(now_ns, &beat.leases);
                }
                done(beat)
            }),
        )
    }

    fn close(&self) {
        self.inner.close()
    }

    fn touch_atimes(&self, take: AtimeTake, done: Done<Vec<(u64, i64)>>) {
        self.inner.touch_atimes(take, done)
    }

    fn fileattr_flags(&self) -> Result<Vec<(u64, u32)>, Errno> {
        self.inner.fileattr_flags()
    }

    fn set_fileattr_flags(
        &self,
        ino: u64,
        flags: u32,
        may_guard: bool,
        ctime_ns: i64,
        done: Done<()>,
    ) {
        self.mark_stale(ino);
        self.inner
            .set_fileattr_flags(ino, flags, may_guard, ctime_ns, done)
    }

    fn lock_conflict(&self, queue: usize, req: &LockReq) -> Result<Option<LockHolder>, Errno> {
        self.inner.lock_conflict(queue, req)
    }

    fn set_lock(&self, req: LockReq, done: Done<Option<LockHolder>>) {
        self.inner.set_lock(req, done)
    }

    fn release_locks(&self, ino: u64, owner: Option<(u64, LockKind)>, done: Done<()>) {
        self.inner.release_locks(ino, owner, done)
    }

    fn hold_orphan(&self, ino: u64, done: Done<bool>) {
        self.inner.hold_orphan(ino, done)
    }

    fn release_hold(&self, ino: u64, done: Done<()>) {
        self.inner.release_hold(ino, done)
    }

    fn sweep_orphans(&self, before_ns: i64, is_open: IsOpen, done: Done<Vec<u64>>) {
        self.inner.sweep_orphans(before_ns, is_open, done)
    }

    fn changes_since(&self, cursors: &mut HashMap<u64, u64>) -> Result<Vec<ChangeRec>, Errno> {
        self.inner.changes_since(cursors)
    }

    fn foreign_lease(&self, queue: usize, dir: u64, now_ns: i64) -> Result<Option<u64>, Errno> {
        self.inner.foreign_lease(queue, dir, now_ns)
    }

    fn lookup_and_foreign_lease(
        &self,
        queue: usize,
        parent: u64,
        name: &[u8],
        now_ns: i64,
    ) -> Result<NameAndLease, Errno> {
        self.inner
            .lookup_and_foreign_lease(queue, parent, name, now_ns)
    }

    fn recalled_leases(&self) -> Result<Vec<u64>, Errno> {
        self.inner.recalled_leases()
    }

    fn change_lease(&self, change: LeaseChange, done: Done<bool>) {
        self.inner.change_lease(change, done)
    }
}
