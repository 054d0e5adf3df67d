//! flock(2) locks and POSIX record locks, kept on the host so that processes using SOURCE
//! directly see them too.
//!
//! flock locks belong to an open file: they are taken on the open file's own host fd.
//! POSIX locks belong to a lock owner (a process, for the kernel) across all its opens of a
//! file, which is what an open file description (OFD) lock on one host fd per (inode, owner)
//! gives: the owner's locks merge and never conflict with each other, and closing that fd
//! drops them all, which we do when the owner closes the file (FLUSH) or the last open of
//! the inode goes.
//!
//! A blocking request (SETLKW, or flock without LOCK_NB) must not tie up a queue's worker or
//! make its caller unkillable: it waits on its own thread, retrying with backoff, and answers
//! EINTR when the kernel sends INTERRUPT for it (a fatal signal to the caller does).

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lanefs_fuse::abi;
use lanefs_fuse::{Reply, Request};

use super::PassthroughFs;
use super::handle::OpenFile;
use super::sys::{self, SysResult};

const SHARDS: usize = 16;
/// A waiting lock retries after this long at first, doubling up to the maximum.
const WAIT_FIRST: Duration = Duration::from_micros(500);
const WAIT_MAX: Duration = Duration::from_millis(20);
/// A waiting thread only retries a syscall and answers: a small stack is plenty.
const WAIT_THREAD_STACK_BYTES: usize = 64 * 1024;
/// Interrupts remembered for requests not yet registered as waiting (INTERRUPT may overtake
/// its request on another queue).
const EARLY_INTERRUPTS_MAX: usize = 64;
/// The kernel's OFFSET_MAX: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// The host fd carrying one lock owner's POSIX locks on one inode, and the process that
/// last locked through it (reported by GETLK: OFD locks have no owning process).
struct OwnerLocks {
    fd: Arc<OwnedFd>,
    pid: u32,
}

type OwnerFds = HashMap<(u64, u64), OwnerLocks>;

/// Requests waiting for a lock, by unique, each with the flag its INTERRUPT sets.
#[derive(Default)]
struct Waiters {
    waiting: HashMap<u64, Arc<AtomicBool>>,
    early: VecDeque<u64>,
}

pub struct LockTable {
    /// (nodeid, lock owner) → the host fd carrying that owner's POSIX locks on the inode,
    /// sharded by nodeid. Lock order: a leaf.
    owners: Box<[Mutex<OwnerFds>]>,
    /// Only blocking lock requests and INTERRUPTs take it (never an ordinary request).
    /// Lock order: a leaf.
    waiters: Arc<Mutex<Waiters>>,
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
            waiters: Arc::default(),
        }
    }

    fn shard(&self, nodeid: u64) -> std::sync::MutexGuard<'_, OwnerFds> {
        self.owners[nodeid as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn owner_fd(&self, nodeid: u64, owner: u64) -> Option<Arc<OwnedFd>> {
        self.shard(nodeid)
            .get(&(nodeid, owner))
            .map(|o| o.fd.clone())
    }

    /// The owner's fd, opened from `file` if it has none yet: read-write when the host
    /// allows, so one fd serves the owner's read and write locks. Records `pid` as the
    /// process locking through it.
    fn owner_fd_or_open(&self, file: &OpenFile, owner: u64, pid: u32) -> SysResult<Arc<OwnedFd>> {
        let nodeid = file.inode.nodeid;
        {
            let mut shard = self.shard(nodeid);
            if let Some(known) = shard.get_mut(&(nodeid, owner)) {
                known.pid = pid;
                return Ok(known.fd.clone());
            }
        }
        let fd = sys::reopen(&file.fd, libc::O_RDWR)
            .or_else(|_| sys::reopen(&file.fd, file.flags & libc::O_ACCMODE))?;
        let fd = Arc::new(fd);
        Ok(self
            .shard(nodeid)
            .entry((nodeid, owner))
            .or_insert(OwnerLocks { fd, pid })
            .fd
            .clone())
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
        drop(fd);
    }

    /// The last open of the inode closed: every owner's locks on it go.
    pub fn release_inode(&self, nodeid: u64) {
        let mut shard = self.shard(nodeid);
        if !shard.is_empty() {
            shard.retain(|(id, _), _| *id != nodeid);
        }
    }

    pub fn interrupt(&self, unique: u64) {
        let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        match w.waiting.get(&unique) {
            Some(flag) => flag.store(true, Ordering::Relaxed),
            None => {
                if w.early.len() == EARLY_INTERRUPTS_MAX {
                    w.early.pop_front();
                }
                w.early.push_back(unique);
            }
        }
    }

    /// Retries `attempt` on a thread of its own until it stops saying "would block", or the
    /// request is interrupted (EINTR); then answers.
    fn wait_on_thread(
        &self,
        unique: u64,
        reply: Reply,
        mut attempt: impl FnMut() -> SysResult<()> + Send + 'static,
    ) {
        let flag = Arc::new(AtomicBool::new(false));
        {
            let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pos) = w.early.iter().position(|u| *u == unique) {
                w.early.remove(pos);
                drop(w);
                return reply.error(libc::EINTR);
            }
            w.waiting.insert(unique, flag.clone());
        }
        let waiters = self.waiters.clone();
        let unregister = move || {
            waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting
                .remove(&unique);
        };
        let spawned = std::thread::Builder::new()
            .name("lanefs-lock-wait".into())
            .stack_size(WAIT_THREAD_STACK_BYTES)
            .spawn({
                let unregister = unregister.clone();
                move || {
                    let mut delay = WAIT_FIRST;
                    let result = loop {
                        if flag.load(Ordering::Relaxed) {
                            break Err(libc::EINTR);
                        }
                        match attempt() {
                            Err(libc::EAGAIN | libc::EACCES) => {
                                std::thread::sleep(delay);
                                delay = (delay * 2).min(WAIT_MAX);
                            }
                            other => break other,
                        }
                    };
                    unregister();
                    match result {
                        Ok(()) => reply.ok(),
                        Err(e) => reply.error(e),
                    }
                }
            });
        if let Err(e) = spawned {
            // The closure (and the reply in it) was dropped, which answered EIO.
            tracing::warn!("cannot start a lock-wait thread: {e}");
            unregister();
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
        if arg.lk_flags & abi::LK_FLOCK != 0 {
            let operation = match arg.lk.typ as i32 {
                libc::F_RDLCK => libc::LOCK_SH,
                libc::F_WRLCK => libc::LOCK_EX,
                _ => libc::LOCK_UN,
            };
            let attempt = move || sys::flock(&file.fd, operation | libc::LOCK_NB);
            return self.lock_or_wait(req.unique, sleep, reply, attempt);
        }
        let typ = arg.lk.typ as i32;
        let nodeid = file.inode.nodeid;
        if typ == libc::F_UNLCK {
            let result = match self.locks.owner_fd(nodeid, arg.owner) {
                Some(fd) => {
                    let mut fl = to_flock(&arg.lk);
                    sys::fcntl_lock(&fd, libc::F_OFD_SETLK, &mut fl)
                }
                None => Ok(()),
            };
            return match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        // As fcntl(2): a read lock needs a readable open, a write lock a writable one.
        if (typ == libc::F_RDLCK && !file.readable()) || (typ == libc::F_WRLCK && !file.writable())
        {
            return reply.error(libc::EBADF);
        }
        let fd = match self.locks.owner_fd_or_open(&file, arg.owner, arg.lk.pid) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let lk = arg.lk;
        let attempt = move || {
            let mut fl = to_flock(&lk);
            sys::fcntl_lock(&fd, libc::F_OFD_SETLK, &mut fl)
        };
        self.lock_or_wait(req.unique, sleep, reply, attempt)
    }

    fn lock_or_wait(
        &self,
        unique: u64,
        sleep: bool,
        reply: Reply,
        mut attempt: impl FnMut() -> SysResult<()> + Send + 'static,
    ) {
        match attempt() {
            Ok(()) => reply.ok(),
            Err(libc::EAGAIN | libc::EACCES) if sleep => {
                self.locks.wait_on_thread(unique, reply, attempt)
            }
            Err(e) => reply.error(e),
        }
    }
}
