//! flock(2) and POSIX locks of a shared volume, kept in the database's `locks` table so that
//! they hold across mounts (a volume that one mount holds leaves them to its kernel, which is
//! exact there, and never negotiates them).
//!
//! A lock is taken by one change (`ops::set_lock`: the inode row's lock, the conflict check,
//! the insert). A blocking request (SETLKW, flock without LOCK_NB) whose lock is held must
//! not tie up a queue's worker: it joins this mount's wait list, served by one thread that
//! checks the waiter's range on a read connection after a back-off (a holder on another
//! mount tells us nothing; a release through this mount retries its inode's waiters at once)
//! and tries the change only when the range looks free. INTERRUPT (a signal to the caller)
//! answers a waiter EINTR, which the kernel restarts or returns. At most `WAITERS_MAX` wait.
//!
//! Locks are dropped by F_UNLCK, by FLUSH for the flushing owner's POSIX locks, by RELEASE
//! (RELEASE_FLOCK_UNLOCK) for the open's flock, at the last close of the inode on this mount
//! (all of its locks there: no process of the mount can hold one any more), at unmount, and
//! by another mount when this one's session expires.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lanefs_fuse::caller::Waiting;
use lanefs_fuse::{Reply, abi};

use crate::meta::*;

/// A waiting lock is checked again after this long at first, doubling up to the maximum:
/// how late a waiter may notice that another mount released its lock.
const WAIT_FIRST: Duration = Duration::from_millis(5);
const WAIT_MAX: Duration = Duration::from_millis(100);
/// At most this many lock requests wait at once per mount; more are answered ENOLCK. Over
/// io_uring each keeps its ring entry while it waits, so, with what the offload pool can
/// park, it stays below what one CPU's ring may add as spares: waiters can never stop a queue.
pub const WAITERS_MAX: usize = 256;
const _: () = assert!(
    WAITERS_MAX + lanefs_fuse::offload::THREADS_PER_NODE + lanefs_fuse::offload::QUEUE_PER_NODE
        <= lanefs_fuse::uring::MAX_RING_ENTRIES - lanefs_fuse::uring::MAX_QUEUE_DEPTH
);
/// At most this many of the waiters may be one user's (root excepted): one user blocking
/// on a lock it holds from many processes never keeps another's requests from waiting
/// (ENOLCK beyond it, as the passthrough's).
pub const WAITERS_PER_USER_MAX: usize = WAITERS_MAX / 4;
/// Interrupts remembered for requests not (yet) on the wait list, the oldest forgotten first.
const INTERRUPTS_MAX: usize = WAITERS_MAX + 64;
/// Shards of the set of (inode, owner) pairs this mount took locks for.
const HELD_SHARDS: usize = 16;
/// The kernel's OFFSET_MAX: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;
/// The waiting thread only checks and answers: a small stack is plenty.
const WAIT_THREAD_STACK_BYTES: usize = 64 * 1024;

/// The lock request the kernel sent, in the store's terms.
pub fn lock_req(ino: u64, arg: &abi::LkIn) -> LockReq {
    let flock = arg.lk_flags & abi::LK_FLOCK != 0;
    LockReq {
        ino,
        owner: arg.owner,
        kind: if flock {
            LockKind::Flock
        } else {
            LockKind::Posix
        },
        typ: arg.lk.typ as i64,
        start: arg.lk.start.min(OFFSET_MAX) as i64,
        end: arg.lk.end.min(OFFSET_MAX) as i64,
        pid: arg.lk.pid,
        fh: arg.fh,
    }
}

/// What F_GETLK answers: the holder's lock, or F_UNLCK over the asked range.
pub fn lock_out(req: &LockReq, holder: Option<LockHolder>) -> abi::FileLock {
    match holder {
        Some(h) => abi::FileLock {
            start: h.start as u64,
            end: h.end as u64,
            typ: h.typ as u32,
            pid: h.pid,
        },
        None => abi::FileLock {
            start: req.start as u64,
            end: req.end as u64,
            typ: LOCK_UNLOCK as u32,
            pid: 0,
        },
    }
}

/// (inode, lock owner, `LockKind` as u8): who took locks of which kind on a file here.
type HeldKey = (u64, u64, u8);

struct Waiter {
    /// The request (its caller's uid counts for `WAITERS_PER_USER_MAX`).
    caller: Waiting,
    req: LockReq,
    reply: Reply,
    next_try: Instant,
    delay: Duration,
}

#[derive(Default)]
struct WaitList {
    waiting: Vec<Waiter>,
    /// Inodes on which this mount released a lock since the thread last looked.
    released: Vec<u64>,
    /// INTERRUPTs not yet matched with a waiter.
    interrupts: VecDeque<u64>,
    /// Waiters per uid other than root (on the list or being tried).
    per_user: HashMap<u32, usize>,
    stop: bool,
}

impl WaitList {
    /// A waiter of `uid` left (answered or interrupted).
    fn left(&mut self, uid: u32) {
        if let Some(n) = self.per_user.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(&uid);
            }
        }
    }
}

struct Waits {
    /// Lock order: a leaf. Taken by blocking lock requests, INTERRUPTs, and releases while
    /// some request waits.
    list: Mutex<WaitList>,
    wake: Condvar,
    /// Requests waiting (on the list or being tried): a release takes the mutex only when
    /// this is not zero.
    count: AtomicUsize,
    /// (inode, owner, kind) this mount took a lock for and has not released at FLUSH,
    /// RELEASE or the last close, with the open its last lock came through: FLUSH and
    /// RELEASE touch the database only for these, so a close costs no commit when its owner
    /// never locked. One mutex per shard (by inode), a leaf, taken by lock requests and,
    /// while this mount holds some lock, closes.
    ///
    /// A process's POSIX locks go at its FLUSH (any close(2) of the file). An OFD lock's
    /// owner is the open file itself, and the kernel sends no unlock when it closes
    /// (fuse_setlk skips FL_CLOSE_POSIX; FLUSH names the closing process): its locks go at
    /// the open's RELEASE (`forget_handle`). A process's entry reaches that RELEASE only if
    /// it locked again through another open after its FLUSH, so only owners whose last lock
    /// came through the released open go.
    held: Box<[Mutex<HashMap<HeldKey, u64>>]>,
    held_count: AtomicUsize,
}

impl Waits {
    fn lock(&self) -> MutexGuard<'_, WaitList> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held_shard(&self, ino: u64) -> MutexGuard<'_, HashMap<HeldKey, u64>> {
        self.held[ino as usize % HELD_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A lock was granted to the owner.
    fn took(&self, req: &LockReq) {
        if req.typ != LOCK_UNLOCK
            && self
                .held_shard(req.ino)
                .insert((req.ino, req.owner, req.kind as u8), req.fh)
                .is_none()
        {
            self.held_count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// This mount's locks: the wait list and which (inode, owner, kind) took locks here.
pub struct Locks {
    waits: Arc<Waits>,
}

impl Locks {
    /// The lock table, and the waiting thread when the volume is shared.
    pub fn new(
        store: &Arc<dyn MetaStore>,
        shared: bool,
    ) -> (Locks, Option<std::thread::JoinHandle<()>>) {
        let waits = Arc::new(Waits {
            list: Mutex::new(WaitList::default()),
            wake: Condvar::new(),
            count: AtomicUsize::new(0),
            held: (0..HELD_SHARDS).map(|_| Mutex::default()).collect(),
            held_count: AtomicUsize::new(0),
        });
        let thread = if shared {
            let (store, served) = (store.clone(), waits.clone());
            match std::thread::Builder::new()
                .name("lanefs-lock-wait".into())
                .stack_size(WAIT_THREAD_STACK_BYTES)
                .spawn(move || serve(&served, &*store))
            {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!("volume: no lock-wait thread ({e}): blocking locks fail");
                    waits.lock().stop = true;
                    None
                }
            }
        } else {
            None
        };
        (Locks { waits }, thread)
    }

    /// Stops the waiting thread (unmount); its waiters get EINTR.
    pub fn stop(&self) {
        let waiting = {
            let mut list = self.waits.lock();
            list.stop = true;
            std::mem::take(&mut list.waiting)
        };
        self.waits.wake.notify_all();
        for w in waiting {
            w.reply.error(libc::EINTR);
        }
    }

    /// A lock was granted to the owner.
    pub fn took(&self, req: &LockReq) {
        self.waits.took(req)
    }

    /// Whether the owner took locks of `kind` on `ino` here; forgets it (they are released).
    pub fn forget(&self, ino: u64, owner: u64, kind: LockKind) -> bool {
        if self.waits.held_count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let removed = self
            .waits
            .held_shard(ino)
            .remove(&(ino, owner, kind as u8))
            .is_some();
        if removed {
            self.waits.held_count.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Open `fh` of `ino` was released (not its last): the POSIX lock owners whose last lock
    /// came through it, forgotten here for their locks to be released (OFD locks: see
    /// `Waits::held`).
    pub fn forget_handle(&self, ino: u64, fh: u64) -> Vec<u64> {
        if self.waits.held_count.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut shard = self.waits.held_shard(ino);
        let owners: Vec<u64> = shard
            .iter()
            .filter(|((i, _, kind), open)| {
                *i == ino && *kind == LockKind::Posix as u8 && **open == fh
            })
            .map(|((_, owner, _), _)| *owner)
            .collect();
        for owner in &owners {
            shard.remove(&(ino, *owner, LockKind::Posix as u8));
        }
        self.waits
            .held_count
            .fetch_sub(owners.len(), Ordering::Relaxed);
        owners
    }

    /// A release of locks on `ino` failed (the database gone past `--db-wait`): the
    /// inode's last close here releases all of them again. (Before, the owner was
    /// forgotten first and nothing tried again: the locks stayed until the mount ended, and
    /// the other mounts' waiters with them.) Noted as an entry no owner's close matches.
    pub fn release_failed(&self, ino: u64) {
        let mut shard = self.waits.held_shard(ino);
        if shard.insert((ino, 0, 0), u64::MAX).is_none() {
            self.waits.held_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether anyone took locks on `ino` here; forgets them all (the last close).
    pub fn forget_inode(&self, ino: u64) -> bool {
        if self.waits.held_count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut shard = self.waits.held_shard(ino);
        let before = shard.len();
        shard.retain(|(i, _, _), _| *i != ino);
        let removed = before - shard.len();
        self.waits.held_count.fetch_sub(removed, Ordering::Relaxed);
        removed > 0
    }

    /// A lock on `ino` was released here: its waiters are tried at once.
    pub fn released(&self, ino: u64) {
        if self.waits.count.load(Ordering::Acquire) == 0 {
            return;
        }
        self.waits.lock().released.push(ino);
        self.waits.wake.notify_one();
    }

    pub fn interrupt(&self, unique: u64) {
        let mut list = self.waits.lock();
        if let Some(pos) = list.waiting.iter().position(|w| w.caller.unique == unique) {
            let waiter = list.waiting.swap_remove(pos);
            self.waits.count.fetch_sub(1, Ordering::AcqRel);
            list.left(waiter.caller.uid);
            drop(list);
            return waiter.reply.error(libc::EINTR);
        }
        // Kept even when nothing waits yet: the request may still be at its first try (a
        // commit), and the kernel sends an INTERRUPT once; lost, the caller would wait
        // unkillable (the kernel waits for the answer uninterruptibly once it sent one)
        // for as long as the holder keeps the lock.
        if list.interrupts.len() == INTERRUPTS_MAX {
            list.interrupts.pop_front();
        }
        list.interrupts.push_back(unique);
        drop(list);
        self.waits.wake.notify_one();
    }

    /// Puts a blocking request whose lock is held on the wait list (ENOLCK when it, or the
    /// caller's share of it, is full; EINTR when its INTERRUPT came first).
    pub fn wait(&self, caller: Waiting, req: LockReq, reply: Reply) {
        let (unique, uid) = (caller.unique, caller.uid);
        let mut list = self.waits.lock();
        if let Some(pos) = list.interrupts.iter().position(|u| *u == unique) {
            // Interrupted during its first try.
            list.interrupts.remove(pos);
            drop(list);
            return reply.error(libc::EINTR);
        }
        // The count, not the list: waiters being tried are off the list for a moment.
        let users = list.per_user.get(&uid).copied().unwrap_or(0);
        if list.stop
            || self.waits.count.load(Ordering::Acquire) >= WAITERS_MAX
            || (uid != 0 && users >= WAITERS_PER_USER_MAX)
        {
            drop(list);
            return reply.error(libc::ENOLCK);
        }
        self.waits.count.fetch_add(1, Ordering::AcqRel);
        if uid != 0 {
            *list.per_user.entry(uid).or_default() += 1;
        }
        list.waiting.push(Waiter {
            caller,
            req,
            reply,
            next_try: Instant::now() + WAIT_FIRST,
            delay: WAIT_FIRST,
        });
        drop(list);
        self.waits.wake.notify_one();
    }
}

/// The waiting thread: checks the waiters that are due, takes the locks that are free, and
/// answers those that got them, failed, or were interrupted.
fn serve(waits: &Waits, store: &dyn MetaStore) {
    let mut list = waits.lock();
    loop {
        if list.stop {
            return;
        }
        let now = Instant::now();
        let released = std::mem::take(&mut list.released);
        let mut due = Vec::new();
        let mut interrupted = Vec::new();
        for waiter in std::mem::take(&mut list.waiting) {
            if let Some(pos) = list
                .interrupts
                .iter()
                .position(|u| *u == waiter.caller.unique)
            {
                list.interrupts.remove(pos);
                waits.count.fetch_sub(1, Ordering::AcqRel);
                list.left(waiter.caller.uid);
                interrupted.push(waiter);
            } else if waiter.next_try <= now || released.contains(&waiter.req.ino) {
                due.push(waiter);
            } else {
                list.waiting.push(waiter);
            }
        }
        drop(list);
        // Answered with no mutex of ours held: an answer may take the ring's own locks.
        for waiter in interrupted {
            waiter.reply.error(libc::EINTR);
        }
        let mut still = Vec::new();
        let mut answered = Vec::new();
        for mut waiter in due {
            // Killed without an INTERRUPT (see `Waiting::is_dying`).
            if waiter.caller.is_dying() {
                waits.count.fetch_sub(1, Ordering::AcqRel);
                answered.push(waiter.caller.uid);
                waiter.reply.error(libc::EINTR);
                tracing::debug!(
                    "lock wait of thread {}: its caller is being killed; answered EINTR",
                    waiter.caller.pid
                );
                continue;
            }
            // A read first: a waiter costs the committer nothing while the range is held.
            let result = match store.lock_conflict(0, &waiter.req) {
                Ok(Some(holder)) => Ok(Some(holder)),
                Ok(None) => wait(|done| store.set_lock(waiter.req.clone(), done)),
                Err(e) => Err(e),
            };
            match result {
                Ok(Some(_)) => {
                    waiter.next_try = Instant::now() + waiter.delay;
                    waiter.delay = (waiter.delay * 2).min(WAIT_MAX);
                    still.push(waiter);
                }
                Ok(None) => {
                    waits.took(&waiter.req);
                    waits.count.fetch_sub(1, Ordering::AcqRel);
                    answered.push(waiter.caller.uid);
                    waiter.reply.ok()
                }
                Err(e) => {
                    waits.count.fetch_sub(1, Ordering::AcqRel);
                    answered.push(waiter.caller.uid);
                    waiter.reply.error(e)
                }
            }
        }
        list = waits.lock();
        for uid in answered {
            list.left(uid);
        }
        list.waiting.append(&mut still);
        let pending_interrupt = list
            .waiting
            .iter()
            .any(|w| list.interrupts.contains(&w.caller.unique));
        if !list.released.is_empty() || pending_interrupt || list.stop {
            continue;
        }
        let next = list.waiting.iter().map(|w| w.next_try).min();
        list = match next {
            Some(at) => {
                let timeout = at.saturating_duration_since(Instant::now());
                waits
                    .wake
                    .wait_timeout(list, timeout)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => waits.wake.wait(list).unwrap_or_else(|e| e.into_inner()),
        };
    }
}
