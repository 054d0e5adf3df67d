//! flock(2) locks and POSIX record locks, kept on the host so that processes using SOURCE
//! directly see them too.
//!
//! flock locks belong to an open file: they are taken on the open file's own host fd.
//! POSIX locks belong to a lock owner (a process, for the kernel) across all its opens of a
//! file, which is what an open file description (OFD) lock on one host fd per (inode, owner)
//! gives: the owner's locks merge and never conflict with each other, and closing that fd
//! drops them all, which we do when the owner closes the file (FLUSH) or the last open of
//! the inode goes. That fd is opened with the access mode of the owner's open it first locks
//! through, so the host never sees a file open for writing that the client only reads (an
//! executable stays executable, a read lease stays); an owner that later locks through an
//! open of another mode moves its locks to a read-write fd.
//!
//! A blocking request (SETLKW, or flock without LOCK_NB) must not tie up a queue's worker or
//! make its caller unkillable: it joins the mount's wait list, served by one thread that
//! retries a waiter (never blocking: F_OFD_SETLK, LOCK_NB) when a lock on its inode is
//! released through us, and otherwise after a back-off for holders on the host, and answers
//! EINTR when the kernel sends INTERRUPT for it (a fatal signal to the caller does). At most
//! `WAITERS_MAX` requests wait at once; more are refused with ENOLCK.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lanefs_fuse::abi;
use lanefs_fuse::caller::Waiting;
use lanefs_fuse::{Reply, Request};

use super::PassthroughFs;
use super::handle::OpenFile;
use super::sys::{self, SysResult};

const SHARDS: usize = 16;
/// A waiting lock is retried at once when a lock on its inode is released through us; for a
/// holder on the host (which tells us nothing) it is retried after this long at first,
/// doubling up to the maximum.
const WAIT_FIRST: Duration = Duration::from_millis(1);
const WAIT_MAX: Duration = Duration::from_millis(100);
/// At most this many lock requests wait at once per mount; more are answered ENOLCK. Over
/// io_uring each keeps its ring entry while it waits, so with everything else that can park
/// at once (the offload pool's jobs) it stays below what one CPU's ring may add as spares:
/// waiters, all from one CPU, can never stop that CPU's queue.
pub const WAITERS_MAX: usize = 256;
const _: () = assert!(
    WAITERS_MAX + lanefs_fuse::offload::THREADS_PER_NODE + lanefs_fuse::offload::QUEUE_PER_NODE
        <= lanefs_fuse::uring::MAX_RING_ENTRIES - lanefs_fuse::uring::MAX_QUEUE_DEPTH
);
/// At most this many of the waiters may be one user's (root excepted, who could exhaust the
/// host anyway): one user's waiters never keep another's from waiting (ENOLCK beyond it).
pub const WAITERS_PER_USER_MAX: usize = WAITERS_MAX / 4;
/// The waiting thread only retries non-blocking syscalls and answers: a small stack is plenty.
const WAIT_THREAD_STACK_BYTES: usize = 64 * 1024;
/// Interrupts remembered for requests not on the wait list (INTERRUPT may overtake its
/// request on another queue, or arrive while the thread retries it), the oldest forgotten
/// first: room for every waiter being killed at once, and some.
const INTERRUPTS_MAX: usize = WAITERS_MAX + 64;
/// The kernel's OFFSET_MAX: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// The host fd carrying one lock owner's POSIX locks on one inode, its access mode, the
/// process that last locked through it (reported by GETLK: OFD locks have no owning process),
/// and the open (FUSE handle) it last locked through.
///
/// A process's locks go at its FLUSH (any close(2) of the file). An OFD lock's owner is the
/// open file itself: the kernel sends no unlock when it closes (fuse_setlk skips
/// FL_CLOSE_POSIX, FLUSH names the closing process), so its locks go at the open's RELEASE,
/// `release_handle`; a process's entry reaches that RELEASE only if the process locked again
/// through another open after its FLUSH, so only owners whose last lock came through the
/// released open go.
struct OwnerLocks {
    fd: Arc<OwnedFd>,
    access: i32,
    pid: u32,
    fh: u64,
}

type OwnerFds = HashMap<(u64, u64), OwnerLocks>;

/// (nodeid, lock owner) → the host fd carrying that owner's POSIX locks on the inode, sharded
/// by nodeid; shared with the waiting thread. Lock order: a leaf.
type Owners = Arc<[Mutex<OwnerFds>]>;

/// One try that never blocks: Ok with what answers the request once it succeeded, or an
/// error; the waiter's `retry` says which errors mean "not yet" (someone else holds the lock,
/// a lease break is under way).
type Attempt = Box<dyn FnMut() -> SysResult<Answer> + Send>;

/// Answers a request whose attempt succeeded (a lock's `reply.ok()`, an open's answer).
pub type Answer = Box<dyn FnOnce(Reply) + Send>;

/// A lock attempt that fails because of another holder: EAGAIN (OFD locks, flock) or EACCES
/// (what fcntl(2) allows too).
fn lock_held(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EACCES)
}

/// An open that fails because a lease break is under way.
fn lease_held(errno: i32) -> bool {
    errno == libc::EWOULDBLOCK
}

/// A lock request waiting for its lock.
struct Waiter {
    /// The request (its caller's uid counts for `WAITERS_PER_USER_MAX`).
    caller: Waiting,
    nodeid: u64,
    reply: Reply,
    attempt: Attempt,
    /// Which of the attempt's errors mean "try again later".
    retry: fn(i32) -> bool,
    /// When to retry if nothing is released through us before (a host-side holder).
    next_try: Instant,
    delay: Duration,
}

#[derive(Default)]
struct WaitList {
    waiting: Vec<Waiter>,
    /// Inodes on which a lock was released through us since the thread last looked.
    released: Vec<u64>,
    /// INTERRUPTs not yet matched with a waiter (the oldest dropped beyond INTERRUPTS_MAX).
    interrupts: VecDeque<u64>,
    /// Waiters per uid other than root (on the list or being retried).
    per_user: HashMap<u32, usize>,
    thread_started: bool,
}

struct Waits {
    /// Lock order: a leaf. Only blocking lock requests, INTERRUPTs and, while some request
    /// waits, lock releases take it.
    list: Mutex<WaitList>,
    wake: Condvar,
    /// Requests waiting (on the list or being retried): a release through us takes the
    /// mutex only when this is not zero.
    count: AtomicUsize,
}

pub struct LockTable {
    owners: Owners,
    waits: Arc<Waits>,
}

fn shard(owners: &[Mutex<OwnerFds>], nodeid: u64) -> MutexGuard<'_, OwnerFds> {
    owners[nodeid as usize % SHARDS]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Whether an fd opened with `access` may carry a lock of `typ` (as fcntl(2) checks).
fn access_allows(access: i32, typ: i32) -> bool {
    match typ {
        libc::F_RDLCK => access != libc::O_WRONLY,
        libc::F_WRLCK => access != libc::O_RDONLY,
        _ => true,
    }
}

/// The owner's fd for a lock of `typ` through `file`, opened if it has none yet with that
/// open's own access mode. When the owner's fd cannot carry `typ` (it first locked through
/// a read-only open, now through a writable one, or the reverse), it moves to a read-write
/// fd, its locks with it. Records `pid` as the process locking through it, and `fh` (the
/// handle of `file`) as the open.
fn owner_fd_for(
    owners: &[Mutex<OwnerFds>],
    (file, fh): (&OpenFile, u64),
    owner: u64,
    pid: u32,
    typ: i32,
) -> SysResult<Arc<OwnedFd>> {
    let nodeid = file.inode.nodeid;
    // The host opens happen with the shard unlocked (an open can take long on the host, and
    // the shard serves every lock of its inodes); the state is looked at again afterwards,
    // since another request of the owner may have changed it meanwhile.
    let wider = {
        let mut shard = shard(owners, nodeid);
        match shard.get_mut(&(nodeid, owner)) {
            Some(known) => {
                known.pid = pid;
                known.fh = fh;
                if access_allows(known.access, typ) {
                    return Ok(known.fd.clone());
                }
                true
            }
            None => false,
        }
    };
    if wider {
        let wider = sys::reopen(&file.fd, libc::O_RDWR)?;
        let mut shard = shard(owners, nodeid);
        if let Some(known) = shard.get_mut(&(nodeid, owner)) {
            if !access_allows(known.access, typ) {
                move_locks(&known.fd, &wider);
                known.fd = Arc::new(wider);
                known.access = libc::O_RDWR;
            }
            return Ok(known.fd.clone());
        }
        // The owner's fd went (FLUSH) meanwhile: start afresh with the read-write fd.
        return Ok(shard
            .entry((nodeid, owner))
            .or_insert(OwnerLocks {
                fd: Arc::new(wider),
                access: libc::O_RDWR,
                pid,
                fh,
            })
            .fd
            .clone());
    }
    let access = file.flags & libc::O_ACCMODE;
    let fd = Arc::new(sys::reopen(&file.fd, access)?);
    let mut shard = shard(owners, nodeid);
    let known = shard.entry((nodeid, owner)).or_insert(OwnerLocks {
        fd,
        access,
        pid,
        fh,
    });
    known.fh = fh;
    if !access_allows(known.access, typ) {
        // Another request of the owner made a narrower fd meanwhile: try again, widening it.
        drop(shard);
        return owner_fd_for(owners, (file, fh), owner, pid, typ);
    }
    Ok(known.fd.clone())
}

/// Moves the OFD locks held through `from` to `to` (listed in /proc/self/fdinfo). Read locks
/// are taken on `to` before `from` lets go; a write lock can only be let go first, so another
/// process may take the range in between, which the owner then no longer holds (logged).
fn move_locks(from: &OwnedFd, to: &OwnedFd) {
    let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", from.as_raw_fd()))
    else {
        return;
    };
    for line in info.lines().filter(|l| l.starts_with("lock:")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let typ = if words.contains(&"WRITE") {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        let (Some(start), Some(end)) = (
            words
                .get(words.len().saturating_sub(2))
                .and_then(|w| w.parse::<i64>().ok()),
            words.last().map(|w| w.parse::<i64>().ok()),
        ) else {
            continue;
        };
        let range = |l_type: i32| libc::flock {
            l_type: l_type as i16,
            l_whence: libc::SEEK_SET as i16,
            l_start: start,
            // "EOF": to the end of the file.
            l_len: end.map_or(0, |end| end - start + 1),
            l_pid: 0,
        };
        if typ == libc::F_WRLCK {
            let _ = sys::fcntl_lock(from, libc::F_OFD_SETLK, &mut range(libc::F_UNLCK));
        }
        if let Err(e) = sys::fcntl_lock(to, libc::F_OFD_SETLK, &mut range(typ)) {
            tracing::warn!(
                errno = e,
                "a lock owner's range was lost moving it to a read-write fd"
            );
        }
    }
}

/// A FUSE lock range (inclusive end, OFFSET_MAX for "to the end") as fcntl's.
fn to_flock(lk: &abi::FileLock) -> libc::flock {
    libc::flock {
        l_type: lk.typ as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: lk.start as i64,
        l_len: if lk.end >= OFFSET_MAX {
            0
        } else {
            (lk.end.saturating_sub(lk.start) + 1) as i64
        },
        // OFD locks require 0.
        l_pid: 0,
    }
}

fn from_flock(fl: &libc::flock) -> abi::FileLock {
    abi::FileLock {
        start: fl.l_start as u64,
        end: if fl.l_len == 0 {
            OFFSET_MAX
        } else {
            (fl.l_start + fl.l_len - 1) as u64
        },
        typ: fl.l_type as u32,
        // Filled in from our record of who holds it.
        pid: 0,
    }
}

impl LockTable {
    pub fn new() -> LockTable {
        LockTable {
            owners: (0..SHARDS).map(|_| Mutex::default()).collect(),
            waits: Arc::new(Waits {
                list: Mutex::default(),
                wake: Condvar::new(),
                count: AtomicUsize::new(0),
            }),
        }
    }

    fn shard(&self, nodeid: u64) -> MutexGuard<'_, OwnerFds> {
        shard(&self.owners, nodeid)
    }

    fn owner_fd(&self, nodeid: u64, owner: u64) -> Option<Arc<OwnedFd>> {
        self.shard(nodeid)
            .get(&(nodeid, owner))
            .map(|o| o.fd.clone())
    }

    /// The process holding `lock` (a conflict GETLK found), among the other owners of the
    /// inode: one that does not see `lock` as a conflict holds it.
    fn holder_pid(&self, nodeid: u64, asking: u64, lock: &libc::flock) -> u32 {
        let shard = self.shard(nodeid);
        let others: Vec<&OwnerLocks> = shard
            .iter()
            .filter(|((id, owner), _)| *id == nodeid && *owner != asking)
            .map(|(_, o)| o)
            .collect();
        if let [only] = others.as_slice() {
            return only.pid;
        }
        others
            .iter()
            .find(|o| {
                let mut probe = *lock;
                probe.l_type = libc::F_WRLCK as i16;
                probe.l_pid = 0;
                sys::fcntl_lock(&o.fd, libc::F_OFD_GETLK, &mut probe).is_ok()
                    && (probe.l_type == libc::F_UNLCK as i16
                        || (probe.l_start, probe.l_len, probe.l_type)
                            != (lock.l_start, lock.l_len, lock.l_type))
            })
            .map_or(0, |o| o.pid)
    }

    /// Whether the owner has a host fd for POSIX locks on the inode (which FLUSH closes).
    pub fn holds_owner(&self, nodeid: u64, owner: u64) -> bool {
        self.shard(nodeid).contains_key(&(nodeid, owner))
    }

    /// The owner closed the file: its POSIX locks on the inode go (close(2) semantics).
    pub fn release_owner(&self, nodeid: u64, owner: u64) {
        let fd = self.shard(nodeid).remove(&(nodeid, owner));
        if fd.is_some() {
            drop(fd);
            self.released(nodeid);
        }
    }

    /// Open `fh` of the inode was released (not its last): the locks of owners whose last
    /// lock came through it go (OFD locks: see `OwnerLocks`).
    pub fn release_handle(&self, nodeid: u64, fh: u64) {
        let gone: Vec<OwnerLocks> = {
            let mut shard = self.shard(nodeid);
            let owners: Vec<(u64, u64)> = shard
                .iter()
                .filter(|((id, _), o)| *id == nodeid && o.fh == fh)
                .map(|(key, _)| *key)
                .collect();
            owners.iter().filter_map(|k| shard.remove(k)).collect()
        };
        // The host fds close outside the shard.
        drop(gone);
        self.released(nodeid);
    }

    /// The last open of the inode closed: every owner's locks on it go.
    pub fn release_inode(&self, nodeid: u64) {
        {
            let mut shard = self.shard(nodeid);
            if !shard.is_empty() {
                shard.retain(|(id, _), _| *id != nodeid);
            }
        }
        self.released(nodeid);
    }

    /// How many lock requests wait (`lanefs stats`).
    pub fn waiting(&self) -> u64 {
        self.waits.count.load(Ordering::Relaxed) as u64
    }

    /// A lock on `nodeid` may have been released through us: its waiters try again now.
    /// One atomic load when nothing waits.
    pub fn released(&self, nodeid: u64) {
        if self.waits.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut list = self.waits.lock();
        if !list.released.contains(&nodeid) {
            list.released.push(nodeid);
        }
        drop(list);
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
        if list.interrupts.len() == INTERRUPTS_MAX {
            list.interrupts.pop_front();
        }
        list.interrupts.push_back(unique);
        drop(list);
        self.waits.wake.notify_one();
    }

    /// Puts an open waiting for a host lease break on the wait list, which tries it again
    /// (without blocking) after a back-off until the lease is gone: one thread for every
    /// waiter, so lease waits never hold a queue's worker or an offload thread. Bounded with
    /// the lock waiters (the same list): beyond it the open fails with ENOLCK.
    pub fn wait_for_open(&self, caller: Waiting, nodeid: u64, reply: Reply, attempt: Attempt) {
        self.wait(caller, nodeid, reply, attempt, lease_held)
    }

    /// Puts a request whose lock is held elsewhere (or whose open waits for a lease break)
    /// on the wait list (ENOLCK when it, or the caller's share of it, is full; EINTR when
    /// its INTERRUPT came first); the waiting thread answers it.
    fn wait(
        &self,
        caller: Waiting,
        nodeid: u64,
        reply: Reply,
        attempt: Attempt,
        retry: fn(i32) -> bool,
    ) {
        let (unique, uid) = (caller.unique, caller.uid);
        let mut list = self.waits.lock();
        if let Some(pos) = list.interrupts.iter().position(|u| *u == unique) {
            list.interrupts.remove(pos);
            drop(list);
            return reply.error(libc::EINTR);
        }
        // The count, not the list: waiters being retried are off the list for a moment.
        let users = list.per_user.get(&uid).copied().unwrap_or(0);
        if self.waits.count.load(Ordering::Acquire) >= WAITERS_MAX
            || (uid != 0 && users >= WAITERS_PER_USER_MAX)
        {
            drop(list);
            return reply.error(libc::ENOLCK);
        }
        if !list.thread_started {
            let waits = self.waits.clone();
            let spawned = std::thread::Builder::new()
                .name("lanefs-lock-wait".into())
                .stack_size(WAIT_THREAD_STACK_BYTES)
                .spawn(move || waits.serve());
            if let Err(e) = spawned {
                drop(list);
                tracing::warn!("cannot start the lock-wait thread: {e}");
                return reply.error(libc::ENOLCK);
            }
            list.thread_started = true;
        }
        self.waits.count.fetch_add(1, Ordering::AcqRel);
        if uid != 0 {
            *list.per_user.entry(uid).or_default() += 1;
        }
        // Tried again at once: a lock released between the caller's try and now told no one.
        list.waiting.push(Waiter {
            caller,
            nodeid,
            reply,
            attempt,
            retry,
            next_try: Instant::now(),
            delay: WAIT_FIRST,
        });
        drop(list);
        self.waits.wake.notify_one();
    }
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

impl Waits {
    fn lock(&self) -> MutexGuard<'_, WaitList> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The waiting thread: retries the waiters that are due (their inode saw a release, their
    /// back-off ran out) and answers those that got their lock, failed, or were interrupted.
    fn serve(&self) {
        let mut list = self.lock();
        loop {
            let now = Instant::now();
            let released = std::mem::take(&mut list.released);
            let mut due = Vec::new();
            for waiter in std::mem::take(&mut list.waiting) {
                let interrupted = list
                    .interrupts
                    .iter()
                    .position(|u| *u == waiter.caller.unique);
                if let Some(pos) = interrupted {
                    list.interrupts.remove(pos);
                    self.count.fetch_sub(1, Ordering::AcqRel);
                    list.left(waiter.caller.uid);
                    waiter.reply.error(libc::EINTR);
                } else if waiter.next_try <= now || released.contains(&waiter.nodeid) {
                    due.push(waiter);
                } else {
                    list.waiting.push(waiter);
                }
            }
            drop(list);
            let mut still = Vec::new();
            let mut answered = Vec::new();
            for mut waiter in due {
                // Killed without an INTERRUPT (see `Waiting::is_dying`).
                if waiter.caller.is_dying() {
                    self.count.fetch_sub(1, Ordering::AcqRel);
                    answered.push(waiter.caller.uid);
                    waiter.reply.error(libc::EINTR);
                    tracing::debug!(
                        "lock wait of thread {}: its caller is being killed; answered EINTR",
                        waiter.caller.pid
                    );
                    continue;
                }
                match (waiter.attempt)() {
                    Err(e) if (waiter.retry)(e) => {
                        waiter.next_try = now + waiter.delay;
                        waiter.delay = (waiter.delay * 2).min(WAIT_MAX);
                        still.push(waiter);
                    }
                    result => {
                        self.count.fetch_sub(1, Ordering::AcqRel);
                        answered.push(waiter.caller.uid);
                        match result {
                            Ok(answer) => answer(waiter.reply),
                            Err(e) => waiter.reply.error(e),
                        }
                    }
                }
            }
            list = self.lock();
            for uid in answered {
                list.left(uid);
            }
            list.waiting.append(&mut still);
            let pending_interrupt = list
                .waiting
                .iter()
                .any(|w| list.interrupts.contains(&w.caller.unique));
            if !list.released.is_empty() || pending_interrupt {
                continue;
            }
            let next = list.waiting.iter().map(|w| w.next_try).min();
            list = match next {
                Some(at) => {
                    let timeout = at.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(list, timeout)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(list).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

impl PassthroughFs {
    pub(super) fn do_getlk(&self, _ino: u64, arg: &abi::LkIn) -> SysResult<abi::FileLock> {
        let file = self.files.get(arg.fh).ok_or(libc::EBADF)?;
        let mut fl = to_flock(&arg.lk);
        // The owner's own fd, so its own locks do not count as conflicts.
        let fd = self.locks.owner_fd(file.inode.nodeid, arg.owner);
        let fd = fd.as_deref().unwrap_or(&file.fd);
        sys::fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
        let mut lock = from_flock(&fl);
        if fl.l_type != libc::F_UNLCK as i16 {
            lock.pid = self.locks.holder_pid(file.inode.nodeid, arg.owner, &fl);
        }
        Ok(lock)
    }

    pub(super) fn do_setlk(
        &self,
        req: &Request,
        _ino: u64,
        arg: &abi::LkIn,
        sleep: bool,
        reply: Reply,
    ) {
        let file = match self.files.get(arg.fh) {
            Some(file) => file,
            None => return reply.error(libc::EBADF),
        };
        let nodeid = file.inode.nodeid;
        let typ = arg.lk.typ as i32;
        if arg.lk_flags & abi::LK_FLOCK != 0 {
            let operation = match typ {
                libc::F_RDLCK => libc::LOCK_SH,
                libc::F_WRLCK => libc::LOCK_EX,
                _ => libc::LOCK_UN,
            };
            let attempt =
                move || sys::flock(&file.fd, operation | libc::LOCK_NB).map(|()| lock_granted());
            self.lock_or_wait(Waiting::of(req), nodeid, sleep, reply, Box::new(attempt));
            if operation == libc::LOCK_UN {
                self.locks.released(nodeid);
            }
            return;
        }
        if typ == libc::F_UNLCK {
            let result = match self.locks.owner_fd(nodeid, arg.owner) {
                Some(fd) => {
                    let mut fl = to_flock(&arg.lk);
                    sys::fcntl_lock(&fd, libc::F_OFD_SETLK, &mut fl)
                }
                None => Ok(()),
            };
            self.locks.released(nodeid);
            return match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        // As fcntl(2): a read lock needs a readable open, a write lock a writable one.
        if !access_allows(file.flags & libc::O_ACCMODE, typ) {
            return reply.error(libc::EBADF);
        }
        let (owners, owner, pid, lk, fh) = (
            self.locks.owners.clone(),
            arg.owner,
            arg.lk.pid,
            arg.lk,
            arg.fh,
        );
        // The owner's fd is looked up on every try: it may move to a read-write fd meanwhile.
        let attempt = move || {
            let fd = owner_fd_for(&owners, (&file, fh), owner, pid, typ)?;
            sys::fcntl_lock(&fd, libc::F_OFD_SETLK, &mut to_flock(&lk)).map(|()| lock_granted())
        };
        self.lock_or_wait(Waiting::of(req), nodeid, sleep, reply, Box::new(attempt))
    }

    fn lock_or_wait(
        &self,
        caller: Waiting,
        nodeid: u64,
        sleep: bool,
        reply: Reply,
        mut attempt: Attempt,
    ) {
        match attempt() {
            Ok(answer) => answer(reply),
            Err(e) if sleep && lock_held(e) => {
                self.locks.wait(caller, nodeid, reply, attempt, lock_held)
            }
            Err(e) => reply.error(e),
        }
    }
}

/// The answer to a lock request that got its lock (a zero-sized closure: no allocation).
fn lock_granted() -> Answer {
    Box::new(|reply: Reply| reply.ok())
}
