//! The FUSE-over-io_uring transport (Linux 6.14+): one ring per possible CPU, each served by
//! a worker pinned to that CPU. The kernel queues a request on the ring of the CPU its caller
//! runs on, so a request and its answer stay on one CPU.
//!
//! A ring keeps `depth` entries free for new requests, plus a spare for each request parked
//! beyond them (see `serve_ring`). Each entry is a pair of buffers registered with the
//! kernel (a 288-byte `UringReqHeader` and a payload buffer of the connection's largest
//! payload, an unpopulated mapping that costs memory once used, first touched on the
//! worker's CPU). An entry cycles: REGISTER (or COMMIT_AND_FETCH) is in the kernel → its
//! completion carries a request → the file system answers through a
//! [`Reply`](crate::Reply) → the answer is written into the entry's buffers → the worker
//! submits COMMIT_AND_FETCH, which hands the answer to the kernel and waits for the next
//! request in one step. WRITEs are served where the kernel put them (the headers are copied
//! in front of the data); other requests are rebuilt in the worker's buffer; see
//! `serve_entry`.
//!
//! Replies from other threads. Every submission of a ring comes from its worker: the kernel
//! copies the next request into the entry's buffers in the context of the task that submitted
//! the fetch (task work), so a fetch submitted by an arbitrary file-system thread would be
//! delivered only when that thread next enters the kernel. A reply made on the worker (the
//! usual, inline case) goes on a thread-local list the worker drains after each batch of
//! completions: no lock, no syscall. A reply made on any other thread writes its answer into
//! the entry (which that reply alone owns until it is committed), pushes the entry on the
//! ring's `deferred` list and wakes the worker through an eventfd the worker always has a read
//! pending on.
//!
//! Head-of-line blocking: handlers run inline on the worker, as on /dev/fuse. While one
//! handler blocks, the other requests of that ring wait (requests on other CPUs do not). A
//! file system that may block hands the work to the offload pool (`Reply::offload`) or
//! keeps the `Reply` and answers from its own thread: the request is parked, the entry stays
//! with it, and the worker goes on serving with a spare.

use std::cell::{RefCell, UnsafeCell};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::abi::{self, init_flags, uring_cmd};
use crate::dispatch::{Dispatched, dispatch};
use crate::filesystem::{Connection, Filesystem};
use crate::reply::{QueueHandle, Reply, ReplySink};
use crate::request::WireFormat;
use crate::ring::{Cqe, Ring, Sqe128};
use crate::topology;

/// Where the kernel says whether FUSE over io_uring may be used.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
/// Entries per ring when not told otherwise: enough to overlap a few requests per CPU
/// without pinning much memory (each entry holds a max_write-sized payload buffer).
pub const DEFAULT_QUEUE_DEPTH: usize = 4;
/// How long a ring's worker stays awake after its last completion, yielding its CPU to
/// anything runnable, before it sleeps in io_uring_enter: 50 us unless `--poll-us` says
/// otherwise.
///
/// Why: a synchronous caller and the worker of its CPU's ring hand the CPU back and forth.
/// When the worker's commit wakes the caller, the worker is still running, so the scheduler
/// sees the caller's CPU busy and moves the caller to an idle CPU (its `recent_used_cpu`); the
/// caller's next request then lands on that CPU's ring, whose worker answers and moves it
/// back. Every round trip then pays a cross-CPU wake-up of a halted CPU. Measured on the
/// 2-vCPU VM (fio 4k psync, 1 job): null 36k IOPS with 40k migrations/s, 203k with the
/// caller pinned; passthrough buffered writes 25k. A worker that is still awake (yielding)
/// keeps its CPU from looking idle, so the caller stays where it is: null 175k, passthrough
/// buffered writes 95k (/dev/fuse: 86k and 44k). Unlike the /dev/fuse poller, which every
/// queue's request wakes, a ring's poller sits on its callers' CPU and yields to them; with
/// seed 002's oversubscribed seek load it raised seeks (passthrough, 4 readers: 6.2k/s to
/// 14.0k/s) instead of starving the callers. The window is a ceiling: `PollBudget` polls
/// only while polling catches requests.
pub const DEFAULT_RING_POLL: Duration = Duration::from_micros(50);
/// The most entries a ring may have (the kernel has no limit; memory does).
pub const MAX_QUEUE_DEPTH: usize = 128;
/// Requests smaller than this fit a payload buffer whatever max_write is (FUSE_MIN_READ_BUFFER).
const MIN_PAYLOAD_BYTES: usize = 8192;
/// Pages per request when MAX_PAGES is not negotiated (FUSE_DEFAULT_MAX_PAGES_PER_REQ).
const DEFAULT_MAX_PAGES: usize = 32;
/// The `user_data` of the worker's pending eventfd read; entries use their index.
const WAKE_TAG: u64 = u64::MAX;
/// How long a REGISTER refused with EAGAIN (connection not yet initialised) waits to retry.
const REGISTER_RETRY: Duration = Duration::from_millis(1);

/// What `/sys/module/fuse/parameters/enable_uring` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSupport {
    Enabled,
    /// The module parameter is N (the default): lanefs never changes it.
    Disabled,
    /// No such parameter: a kernel before 6.14, or one built without CONFIG_FUSE_IO_URING.
    Missing,
}

impl KernelSupport {
    pub fn read() -> KernelSupport {
        match std::fs::read_to_string(ENABLE_PARAMETER) {
            Ok(v) if v.trim() == "Y" || v.trim() == "1" => KernelSupport::Enabled,
            Ok(_) => KernelSupport::Disabled,
            Err(_) => KernelSupport::Missing,
        }
    }

    /// Why io_uring cannot be used, and what to do about it; None when it can.
    pub fn obstacle(self) -> Option<String> {
        match self {
            KernelSupport::Enabled => None,
            KernelSupport::Disabled => Some(format!(
                "io_uring is off in the kernel; turn it on with `echo Y > {ENABLE_PARAMETER}`"
            )),
            KernelSupport::Missing => Some(format!(
                "the kernel has no FUSE io_uring support ({ENABLE_PARAMETER} is missing; \
                 needs Linux 6.14+ with CONFIG_FUSE_IO_URING)"
            )),
        }
    }
}

/// The payload buffer size the kernel requires of every entry: its `max_payload_sz`, the
/// larger of max_write and max_pages pages (and never below 8 KiB).
pub fn payload_bytes(conn: &Connection) -> usize {
    let pages = if conn.flags & init_flags::MAX_PAGES != 0 {
        (conn.max_write as usize).div_ceil(crate::session::page_bytes())
    } else {
        DEFAULT_MAX_PAGES
    };
    (pages * crate::session::page_bytes())
        .max(conn.max_write as usize)
        .max(MIN_PAYLOAD_BYTES)
}

/// Room before the payload for a request's in header and op header, so that a WRITE can be
/// laid out contiguously, as /dev/fuse delivers it, in front of its data without moving the
/// data (8-byte aligned: every op header's size is a multiple of 8).
const PREFIX_BYTES: usize = size_of::<abi::InHeader>() + abi::URING_OP_IN_OUT_SZ;
/// The largest answer that can wait in an entry's staging area (see `EntryBuffers::staged`):
/// an out header and a WRITE's answer, with room to spare.
const STAGE_BYTES: usize = 64;
/// How long a ring's queue may stay silent, after a batch whose requests all parked and that
/// committed nothing, before the ring's kicker makes the kernel hand over a request it may
/// have queued meanwhile (see `Kicker`).
const KICK_AFTER: Duration = Duration::from_millis(10);
/// The kicker's stack: it only waits and makes one syscall.
const KICKER_STACK_BYTES: usize = 64 * 1024;

/// The most entries one ring may have: its depth plus the spares registered while requests
/// are parked (see `serve_ring`). Each costs the kernel a small allocation, us 16 bytes of
/// slot and an unpopulated payload mapping (address space, no memory until used).
pub const MAX_RING_ENTRIES: usize = 512;
/// A spare entry whose last use touched more than this much of its payload buffer gives the
/// pages beyond its answer back to the kernel (MADV_DONTNEED) before it is committed, so
/// that spares, once a large write or read has passed through them, do not stay resident...
const SPARE_RESIDENT_MAX_BYTES: usize = 64 * 1024;
/// ...except the first this many spares, which keep what they touched, as the ring's own
/// entries do. The kernel hands out the entry committed last first, so while requests keep
/// parking (writers waiting for a flush), the same few spares serve one large request after
/// another: given back each time, every 1 MiB WRITE faulted its 256 pages in again (zeroed,
/// charged, then freed), a fifth of all CPU with two fio writers on one volume file. A
/// ring's resident payload is therefore at most `depth` + this many buffers.
const SPARES_KEPT_RESIDENT: usize = 4;
/// io_uring_enter refused for lack of memory or resources (EAGAIN, ENOMEM, EBUSY): the first
/// retry waits this long, doubling up to `ENTER_RETRY_MAX`. The ring is not given up: its
/// CPU's callers would otherwise hang (or the whole mount end) on a passing shortage.
const ENTER_RETRY_FIRST: Duration = Duration::from_millis(1);
const ENTER_RETRY_MAX: Duration = Duration::from_millis(100);
/// How many retries of a transient io_uring_enter failure pass between two log lines.
const ENTER_RETRY_LOG_EVERY: u32 = 100;
/// How many flushes a push waits (about 1 ms apart) for room in a full submission ring before
/// the ring is declared broken.
const PUSH_FLUSH_TRIES: u32 = 1000;

/// An answer written while its request still borrowed the payload buffer.
struct StagedAnswer {
    /// Bytes used in `bytes`: the out header, then the answer's payload. 0: nothing staged.
    len: usize,
    bytes: [u8; STAGE_BYTES],
}

/// An anonymous private mapping: one page of room for a WRITE's headers (`PREFIX_BYTES` at
/// its end), then the payload buffer the kernel knows, page aligned. MAP_NORESERVE and not
/// populated: a page costs memory only once the kernel or a handler writes it (so an entry
/// that carries only locks, getattrs and other payload-less requests costs none), and first
/// touch comes from the ring's pinned worker (the kernel copies requests in that task's
/// context), so the pages come from its own NUMA node.
struct PayloadRegion {
    base: *mut u8,
    len: usize,
}

impl PayloadRegion {
    fn new(payload_bytes: usize) -> io::Result<PayloadRegion> {
        let page = crate::session::page_bytes();
        let len = page + payload_bytes.div_ceil(page) * page;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(PayloadRegion {
            base: base.cast(),
            len,
        })
    }

    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: the mapping is one page longer than the payload buffer.
        unsafe { self.base.add(crate::session::page_bytes()) }
    }

    fn payload_len(&self) -> usize {
        self.len - crate::session::page_bytes()
    }

    /// Gives the payload pages from `keep` bytes on back to the kernel; they read as zeros
    /// and cost nothing until written again.
    fn release_from(&self, keep: usize) {
        let page = crate::session::page_bytes();
        let from = keep.div_ceil(page) * page;
        if from >= self.payload_len() {
            return;
        }
        // SAFETY: the range lies inside our own mapping, and nothing in it is in use: the
        // answer (the first `keep` bytes) is kept.
        let rc = unsafe {
            libc::madvise(
                self.payload_ptr().add(from).cast(),
                self.payload_len() - from,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            tracing::debug!(
                "releasing a spare ring entry's pages: {}",
                io::Error::last_os_error()
            );
        }
    }
}

impl Drop for PayloadRegion {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in `new`, not yet unmapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One entry's buffers, shared with the kernel.
///
/// Ownership, which makes the unsynchronised access sound: while a REGISTER or
/// COMMIT_AND_FETCH of the entry is in the kernel, only the kernel touches the buffers; from
/// its completion until dispatch, the worker; from dispatch until the answer is written, the
/// request's `Reply` (one, on any thread) — except that while `borrowed` is set the handler
/// still reads the request in the payload buffer, so the answer goes to `staged` instead;
/// then the worker again, until it submits the commit.
struct EntryBuffers {
    header: UnsafeCell<abi::UringReqHeader>,
    region: PayloadRegion,
    /// What REGISTER points at: [header, payload buffer]. Read by the kernel only.
    iov: [libc::iovec; 2],
    /// Set by the worker while a handler runs on a request whose payload lies in the payload
    /// buffer (a WRITE served in place); cleared (Release) when the handler has returned.
    borrowed: AtomicBool,
    staged: UnsafeCell<StagedAnswer>,
}

// SAFETY: access follows the ownership protocol above: at any time one party (kernel, worker,
// or the one Reply of the entry's request) owns the buffers, and ownership moves between
// threads through the deferred-list mutex or the worker's own thread; `borrowed` (Acquire
// against the worker's Release) tells a Reply whether the handler is done with the payload.
// The raw pointers (mapping, iovecs) point into memory the entry itself owns.
unsafe impl Sync for EntryBuffers {}
// SAFETY: as above; nothing in an entry is tied to the thread that made it.
unsafe impl Send for EntryBuffers {}

impl EntryBuffers {
    /// Boxed, so that the header and iovecs the kernel is given never move.
    fn new(payload_bytes: usize) -> io::Result<Box<EntryBuffers>> {
        let region = PayloadRegion::new(payload_bytes)?;
        let mut entry = Box::new(EntryBuffers {
            header: UnsafeCell::new(abi::UringReqHeader::new_zeroed()),
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
            borrowed: AtomicBool::new(false),
            staged: UnsafeCell::new(StagedAnswer {
                len: 0,
                bytes: [0; STAGE_BYTES],
            }),
            region,
        });
        entry.iov = [
            libc::iovec {
                iov_base: entry.header.get().cast(),
                iov_len: size_of::<abi::UringReqHeader>(),
            },
            libc::iovec {
                iov_base: entry.region.payload_ptr().cast(),
                iov_len: entry.region.payload_len(),
            },
        ];
        Ok(entry)
    }

    fn payload_ptr(&self) -> *mut u8 {
        self.region.payload_ptr()
    }

    fn payload_len(&self) -> usize {
        self.region.payload_len()
    }

    /// Where a WRITE's headers go: the last `PREFIX_BYTES` before the payload.
    fn prefix_ptr(&self) -> *mut u8 {
        // SAFETY: the page before the payload is part of the mapping.
        unsafe { self.payload_ptr().sub(PREFIX_BYTES) }
    }

    /// Writes an answer (out header, then payload parts) into the header and payload buffer.
    ///
    /// # Safety
    /// The caller owns the entry and no handler borrows its payload buffer; the parts fit it.
    unsafe fn write_answer(&self, out_header: &[u8], parts: &[IoSlice<'_>]) {
        // SAFETY: per the contract, the header and payload are ours to write; the parts are
        // caller memory, never the ring's buffers, and fit the payload buffer.
        unsafe {
            let mut at = self.payload_ptr();
            let mut total = 0;
            for part in parts {
                std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                at = at.add(part.len());
                total += part.len();
            }
            self.write_out_header(out_header, total);
        }
    }

    /// Writes the out header of an answer whose `payload_len` bytes lie in the payload buffer.
    ///
    /// # Safety
    /// The caller owns the entry.
    unsafe fn write_out_header(&self, out_header: &[u8], payload_len: usize) {
        // SAFETY: per the contract, the header is ours to write.
        let header = unsafe { &mut *self.header.get() };
        header.in_out[..out_header.len()].copy_from_slice(out_header);
        header.ring_ent_in_out.payload_sz = payload_len as u32;
    }

    /// Moves a staged answer, if any, into the header and payload buffer (worker, before
    /// committing).
    ///
    /// # Safety
    /// The caller (the worker) owns the entry: its answer has been handed back.
    unsafe fn unstage(&self) {
        // SAFETY: the entry was handed back, so nobody else touches `staged` or the buffers.
        unsafe {
            let staged = &mut *self.staged.get();
            if staged.len == 0 {
                return;
            }
            let out = size_of::<abi::OutHeader>();
            let len = std::mem::take(&mut staged.len);
            self.write_answer(
                &staged.bytes[..out],
                &[IoSlice::new(&staged.bytes[out..len])],
            );
        }
    }

    /// The answer's payload length (worker, after `unstage`).
    ///
    /// # Safety
    /// The caller (the worker) owns the entry.
    unsafe fn answer_len(&self) -> usize {
        // SAFETY: per the contract.
        unsafe { (*self.header.get()).ring_ent_in_out.payload_sz as usize }
    }
}

/// The state of one ring that the replies of its requests share with its worker.
pub struct RingShared {
    /// The entries, by index (the reply token). A slot is set once, by the worker, before
    /// the entry is registered; the worker adds entries while it serves (spares), so the
    /// slots are fixed in number and each entry is boxed, never moved.
    entries: Box<[OnceLock<Box<EntryBuffers>>]>,
    /// Entries answered on threads other than the worker, waiting to be committed.
    /// Lock: one per ring, taken only by such deferred replies and by the worker when the
    /// eventfd wakes it; a leaf (nothing is locked while holding it). Inline replies never
    /// take it.
    deferred: Mutex<Vec<u16>>,
    /// Written by a deferred reply to wake the worker (an eventfd).
    wake: OwnedFd,
    /// The ring's kicker, started on first need. Shared with its thread apart from the rest:
    /// that thread has a descriptor table of its own (`KickTarget::hold_no_connection`), so
    /// it must never drop the last share of what owns a descriptor of the daemon's (`wake`).
    kicker: Arc<Kicker>,
}

/// Makes the kernel hand a ring a request it queued while every entry was out.
///
/// The kernel gives a new request to a free entry of its CPU's queue, or queues it when
/// there is none; a queued request is handed over only by a COMMIT_AND_FETCH, never by a
/// REGISTER (fs/fuse/dev_uring.c). So when requests arrive while all entries are out and
/// every one of them parks (lock waiters arriving together), the spares the worker registers
/// do not reach what waits behind them, and with nothing to commit the queue would stay
/// stuck until some other request or answer came on that CPU. The kicker is that other
/// request: a thread pinned to the ring's CPU which, when the worker asks and the ring then
/// stays silent for `KICK_AFTER`, stats the mount's root with AT_STATX_FORCE_SYNC. Its
/// GETATTR takes a free (spare) entry directly, the worker answers it at once, and that
/// commit fetches the first queued request. A chain of parking requests gets one kick each.
/// Cost: one GETATTR after a parked-only batch followed by silence; nothing otherwise.
///
/// What it stats must be our mount and nothing else (a symlink put at the mount point's
/// name, a mount stacked on ours, another user's FUSE mount there could block the kicker or
/// make it poke someone else's file system): the mount point's parent is opened once
/// (O_PATH), and at each kick the root is opened from it by name with O_PATH|O_NOFOLLOW (no
/// symlink followed, no automount triggered), checked to carry our connection's device with a
/// statx that does not sync (no request reaches any file system), and only then statted with
/// FORCE_SYNC through that fd. The root's fd is held only for the kick: a held fd would make
/// a plain unmount fail. The kicker ends when its ring's worker does (`Kicker::stop`).
struct Kicker {
    /// What the worker asked. Lock: one per ring, taken by the worker after a parked-only
    /// batch and when it ends, and by the kicker thread; a leaf.
    asked: Mutex<KickRequest>,
    ready: std::sync::Condvar,
    started: AtomicBool,
    /// Batches of completions the worker has taken: written by the worker alone, read by
    /// the kicker to see whether anything happened since it was asked.
    progress: AtomicU64,
}

#[derive(Default)]
struct KickRequest {
    /// The progress count the worker saw when it asked, or None.
    progress: Option<u64>,
    /// The worker has ended: the kicker thread exits (and drops its share of the kicker).
    stopped: bool,
}

/// Where the kicker finds our mount's root: the mount point's parent (O_PATH), the mount
/// point's name in it, and our connection's device (major, minor).
struct KickTarget {
    parent: OwnedFd,
    name: std::ffi::CString,
    device: (u32, u32),
}

impl KickTarget {
    fn new(mountpoint: &std::path::Path, device: (u32, u32)) -> io::Result<KickTarget> {
        use std::os::unix::ffi::OsStrExt;
        let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
        let name = mountpoint.file_name().ok_or_else(invalid)?;
        let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| invalid())?;
        let parent = mountpoint.parent().ok_or_else(invalid)?;
        let parent =
            std::ffi::CString::new(parent.as_os_str().as_bytes()).map_err(|_| invalid())?;
        // SAFETY: parent is NUL-terminated; the fd returned is new and owned below.
        let fd = unsafe {
            libc::open(
                parent.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(KickTarget {
            // SAFETY: open returned a new fd that nothing else owns.
            parent: unsafe { OwnedFd::from_raw_fd(fd) },
            name,
            device,
        })
    }

    /// Gives the calling (kicker) thread a descriptor table of its own holding only the mount
    /// point's parent and 0-2 (the log). A kick is a request to our own connection, and once
    /// a worker has taken it the kernel waits for its answer uninterruptibly, even for a
    /// killed thread. Were the daemon killed then (kill -9, the OOM killer), a kicker sharing
    /// the daemon's table would keep its /dev/fuse and ring descriptors open: the connection
    /// would never be aborted, the kick never answered, the process never gone, its mount
    /// dead until someone aborts it in fusectl (seen once in a test: a killed daemon's
    /// kicker still in `request_wait_answer` two hours later). With its own table the
    /// daemon's death releases the connection, which fails the kick.
    fn hold_no_connection(&self) -> io::Result<()> {
        // SAFETY: unshare only changes this thread's own fd table.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let keep = self.parent.as_raw_fd() as libc::c_uint;
        for (first, last) in [(3, keep.saturating_sub(1)), (keep + 1, libc::c_uint::MAX)] {
            if first > last {
                continue;
            }
            // SAFETY: close_range closes descriptors of this thread's private table (every
            // one but `keep` and 0-2); none is used by this thread after this.
            let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Stats our mount's root with FORCE_SYNC, if what the name leads to is our mount's root
    /// (ENXIO otherwise: nothing is touched).
    fn kick(&self) -> io::Result<()> {
        // SAFETY: name is NUL-terminated; the fd returned is new and owned below.
        let fd = unsafe {
            libc::openat(
                self.parent.as_raw_fd(),
                self.name.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: openat returned a new fd that nothing else owns.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        let statx = |flags: i32, mask: u32| -> io::Result<libc::statx> {
            // SAFETY: statx is plain old data, zero is a valid value.
            let mut stx: libc::statx = unsafe { std::mem::zeroed() };
            // SAFETY: the empty path is NUL-terminated, stx is writable.
            let r = unsafe {
                libc::statx(
                    root.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT | flags,
                    mask,
                    &mut stx,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stx)
        };
        // DONT_SYNC: the device number comes from the superblock, no request is sent.
        let seen = statx(libc::AT_STATX_DONT_SYNC, 0)?;
        if (seen.stx_dev_major, seen.stx_dev_minor) != self.device {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        statx(libc::AT_STATX_FORCE_SYNC, libc::STATX_BASIC_STATS).map(drop)
    }
}

impl Kicker {
    /// The kicker thread: see `Kicker`. Ends when the ring's worker or the connection does.
    fn kick_when_silent(&self, qid: u16, target: &KickTarget) {
        if let Err(e) = topology::pin_current_thread(qid as usize) {
            tracing::debug!(qid, "kicker not pinned ({e}): its kicks may land elsewhere");
        }
        if let Err(e) = target.hold_no_connection() {
            tracing::warn!(
                qid,
                "this ring's kicker shares the daemon's descriptors ({e}): a kill -9 during a kick can leave the process and its mount hung"
            );
        }
        loop {
            let asked = {
                let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if asked.stopped {
                        return;
                    }
                    if let Some(progress) = asked.progress.take() {
                        break progress;
                    }
                    asked = self.ready.wait(asked).unwrap_or_else(|e| e.into_inner());
                }
            };
            std::thread::sleep(KICK_AFTER);
            if self.progress.load(Ordering::Relaxed) != asked {
                continue;
            }
            if let Err(e) = target.kick() {
                if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ENODEV)) {
                    return;
                }
                tracing::debug!(qid, "kick: {e}");
            }
        }
    }

    /// Ends the ring's kicker thread (if it runs): called when the worker ends.
    fn stop(&self) {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).stopped = true;
        self.ready.notify_one();
    }
}

impl RingShared {
    pub fn new() -> io::Result<Arc<RingShared>> {
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(RingShared {
            entries: (0..MAX_RING_ENTRIES).map(|_| OnceLock::new()).collect(),
            deferred: Mutex::new(Vec::new()),
            // SAFETY: eventfd returned a new fd that nothing else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            kicker: Arc::new(Kicker {
                asked: Mutex::new(KickRequest::default()),
                ready: std::sync::Condvar::new(),
                started: AtomicBool::new(false),
                progress: AtomicU64::new(0),
            }),
        }))
    }

    /// Asks the kicker (started on first use) to kick unless the ring makes progress first.
    fn ask_for_kick(self: &Arc<RingShared>, config: &RingConfig) {
        let qid = config.qid;
        let Some(device) = config.device else {
            // Without our device number nothing could be checked: no kicks.
            return;
        };
        let progress = self.kicker.progress.load(Ordering::Relaxed);
        self.kicker
            .asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .progress = Some(progress);
        self.kicker.ready.notify_one();
        if !self.kicker.started.swap(true, Ordering::Relaxed) {
            let target = match KickTarget::new(&config.mountpoint, device) {
                Ok(target) => target,
                Err(e) => {
                    tracing::warn!(
                        qid,
                        "this ring's kicker cannot open the mount point's parent: {e}"
                    );
                    return;
                }
            };
            let kicker = self.kicker.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("lanefs-kick{qid}"))
                .stack_size(KICKER_STACK_BYTES)
                .spawn(move || kicker.kick_when_silent(qid, &target));
            if let Err(e) = spawned {
                tracing::warn!(qid, "cannot start this ring's kicker: {e}");
                self.kicker.started.store(false, Ordering::Relaxed);
            }
        }
    }

    fn entry(&self, token: u64) -> &EntryBuffers {
        self.entries
            .get(token as usize)
            .and_then(OnceLock::get)
            .expect("a ring's requests come only from entries it registered")
    }

    /// Wakes the worker: its pending read of the eventfd completes.
    fn wake(&self) -> io::Result<()> {
        let one = 1u64;
        // SAFETY: an 8-byte write from a live u64 to our eventfd.
        let n = unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
        if n == 8 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

thread_local! {
    /// The ring this thread serves (null on threads that serve none) and the entries answered
    /// inline on it, which the worker commits after its current batch.
    static SERVING: RefCell<(*const RingShared, Vec<u16>)> =
        const { RefCell::new((std::ptr::null(), Vec::new())) };
}

/// The reply side of a ring.
pub struct RingSink(pub Arc<RingShared>);

impl ReplySink for RingSink {
    fn send(&self, token: u64, iov: &[IoSlice<'_>]) -> io::Result<()> {
        let shared = &*self.0;
        let entry = shared.entry(token);
        let out_len = size_of::<abi::OutHeader>();
        let payload_len: usize = iov[1..].iter().map(|p| p.len()).sum();
        let borrowed = entry.borrowed.load(Ordering::Acquire);
        let room = if borrowed {
            STAGE_BYTES - out_len
        } else {
            entry.payload_len()
        };
        let mut result = Ok(());
        let eio;
        let (out_header, parts): (&[u8], &[IoSlice<'_>]) =
            if iov[0].len() != out_len || payload_len > room {
                // The kernel could not take it either: answer EIO rather than lose the entry.
                eio = abi::OutHeader::read_from_prefix(&iov[0])
                    .map(|(h, _)| abi::OutHeader {
                        len: out_len as u32,
                        error: -libc::EIO,
                        unique: h.unique,
                    })
                    .unwrap_or_default();
                result = Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a {payload_len}-byte answer does not fit the ring entry's {room} bytes; \
                     answered EIO"
                    ),
                ));
                (eio.as_bytes(), &[])
            } else {
                (&iov[0], &iov[1..])
            };
        if borrowed {
            // SAFETY: this reply owns the entry's staging area (see EntryBuffers); the answer
            // fits it (checked above).
            let staged = unsafe { &mut *entry.staged.get() };
            let mut len = out_len;
            staged.bytes[..len].copy_from_slice(out_header);
            for part in parts {
                staged.bytes[len..len + part.len()].copy_from_slice(part);
                len += part.len();
            }
            staged.len = len;
        } else {
            // SAFETY: this reply owns the entry and no handler borrows the payload buffer
            // (`borrowed` is clear); the parts fit it (checked above).
            unsafe { entry.write_answer(out_header, parts) };
        }
        hand_back(shared, token as u16);
        result
    }

    fn payload_buffer(&self, token: u64) -> Option<(*mut u8, usize)> {
        let entry = self.0.entry(token);
        // While `borrowed`, the request's own data is there (a WRITE still being handled).
        // Otherwise the entry's Reply owns the buffer until it answers (see EntryBuffers).
        (!entry.borrowed.load(Ordering::Acquire))
            .then(|| (entry.payload_ptr(), entry.payload_len()))
    }

    fn send_in_place(&self, token: u64, out_header: &[u8], payload_len: usize) -> io::Result<()> {
        let shared = &*self.0;
        let entry = shared.entry(token);
        // SAFETY: the caller is the entry's Reply, which owns it until the hand-back below;
        // the payload was written into the buffer, within its length.
        unsafe { entry.write_out_header(out_header, payload_len.min(entry.payload_len())) };
        hand_back(shared, token as u16);
        Ok(())
    }
}

/// Gives an answered entry back to its worker for committing.
fn hand_back(shared: &RingShared, entry: u16) {
    let inline = SERVING.with(|serving| {
        let mut serving = serving.borrow_mut();
        let on_worker = std::ptr::eq(serving.0, shared);
        if on_worker {
            serving.1.push(entry);
        }
        on_worker
    });
    if !inline {
        let first = {
            let mut deferred = shared.deferred.lock().unwrap_or_else(|e| e.into_inner());
            deferred.push(entry);
            deferred.len() == 1
        };
        // The worker drains the whole list when it wakes, so only the answer that finds it
        // empty needs to wake it: one eventfd write per batch, not per answer.
        if first && let Err(e) = shared.wake() {
            tracing::warn!("waking a ring worker failed: {e}");
        }
    }
}

/// Where an entry is, as its worker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// A REGISTER is in the kernel.
    Registering,
    /// A COMMIT_AND_FETCH is in the kernel.
    InKernel,
    /// Its request is being served on the worker (answered or not yet).
    Answering,
    /// Its request was parked: the file system answers later, from another thread.
    Parked,
    /// The connection is gone; the kernel will not use the entry again.
    Ended,
}

/// One ring's settings, fixed at the start.
pub struct RingConfig {
    /// The kernel's queue id: the CPU whose requests this ring carries.
    pub qid: u16,
    /// Entries kept free for new requests: the ring registers this many, and one more spare
    /// for each request parked beyond them (up to `MAX_RING_ENTRIES`).
    pub depth: usize,
    pub payload_bytes: usize,
    /// How long the worker stays awake after a batch before sleeping (see
    /// `DEFAULT_RING_POLL`); zero: it sleeps at once.
    pub poll: Duration,
    /// Whether the CPU was online at the start. An offline CPU's ring registers one entry
    /// (the kernel uses the rings only once every possible CPU's queue has one) and the rest
    /// of its depth with its first request, which means the CPU has come online.
    pub online: bool,
    /// The mount point, whose root the ring's kicker stats (see `Kicker`).
    pub mountpoint: std::path::PathBuf,
    /// Our connection's device (major, minor), which the kicker checks the mount point
    /// leads to before it stats it; None (unknown): no kicks.
    pub device: Option<(u32, u32)>,
}

/// The worker's view of its ring's entries.
struct Entries {
    states: Vec<EntryState>,
    commit_ids: Vec<u64>,
    /// Bytes of its payload buffer each entry's current use may have touched (only spares
    /// past `SPARES_KEPT_RESIDENT` are trimmed back, see `SPARE_RESIDENT_MAX_BYTES`).
    touched: Vec<usize>,
    /// Entries whose request is parked.
    parked: usize,
    /// Entries that are not Ended.
    live: usize,
    /// Entries with a command in the kernel (Registering or InKernel), kept by `set` and
    /// `push` so that the end of a batch need not scan every entry.
    in_kernel: usize,
    /// The cap was met and logged (logged again only after it was left).
    at_cap: bool,
}

impl EntryState {
    fn in_kernel(self) -> bool {
        matches!(self, EntryState::InKernel | EntryState::Registering)
    }
}

impl Entries {
    /// Adds an entry whose REGISTER is about to go to the kernel.
    fn push(&mut self) {
        self.states.push(EntryState::Registering);
        self.commit_ids.push(0);
        self.touched.push(0);
        self.live += 1;
        self.in_kernel += 1;
    }

    /// Moves entry `i` to `state`, keeping the count of entries in the kernel.
    fn set(&mut self, i: usize, state: EntryState) {
        let was = std::mem::replace(&mut self.states[i], state);
        self.in_kernel =
            self.in_kernel + usize::from(state.in_kernel()) - usize::from(was.in_kernel());
    }
}

/// Serves one ring until the connection ends. Runs on the ring's worker, already pinned.
///
/// Parked requests. A request whose Reply the file system keeps (a blocking lock waiter, a
/// slow operation handed to the offload pool) keeps its entry until answered: the kernel
/// matches the answer to the entry. So that no number of parked requests leaves the CPU's
/// queue without free entries, the worker registers a spare entry whenever a request parks
/// while fewer than `depth` of the ring's entries are free of parked requests. REGISTER is
/// accepted on a running queue (fs/fuse/dev_uring.c: the entry simply joins the queue's
/// available list), and its payload buffer must be at least the connection's
/// `max_payload_sz`, as for the first ones. An entry cannot be unregistered, so spares stay,
/// and serve like any other entry; their payload buffers are unpopulated mappings, trimmed
/// back after a large use. At `MAX_RING_ENTRIES` no spare is added (logged): parked requests
/// then hold entries the queue cannot replace, and once every entry is parked the CPU's new
/// requests wait for one of them to be answered, as with a fixed depth.
///
/// One limit of the kernel's: a REGISTER does not pick up requests already waiting for an
/// entry (only a new request or a COMMIT_AND_FETCH does). Spares are registered as soon as a
/// request parks, so such a wait needs `depth` requests arriving together and all parking;
/// the ring's `Kicker` then makes the commit that hands over what waits behind them.
pub fn serve_ring<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    dev_fd: &OwnedFd,
    shared: &Arc<RingShared>,
    queue: &Arc<QueueHandle>,
    config: &RingConfig,
) -> io::Result<()> {
    let depth = config.depth.clamp(1, MAX_QUEUE_DEPTH);
    let first_entries = if config.online { depth } else { 1 };
    // Where requests other than WRITEs are rebuilt as /dev/fuse would deliver them, out of
    // the entry, so that their answer can be written into the entry while the handler still
    // borrows the request, and so that payload-less requests touch no payload page.
    let mut request_words =
        vec![
            0u64;
            (size_of::<abi::InHeader>() + abi::URING_OP_IN_OUT_SZ + config.payload_bytes)
                .div_ceil(8)
        ];
    let mut wake_word = Box::new(0u64);
    // Submissions are flushed when the submission ring fills; completions can be as many as
    // the entries plus the wake read.
    let mut ring = Ring::new(depth as u32 + 1, MAX_RING_ENTRIES as u32 + 1)?;
    let mut book = Entries {
        states: Vec::with_capacity(depth),
        commit_ids: Vec::with_capacity(depth),
        touched: Vec::with_capacity(depth),
        parked: 0,
        live: 0,
        in_kernel: 0,
        at_cap: false,
    };
    let dev = dev_fd.as_raw_fd();

    let push = |ring: &mut Ring, sqe: &Sqe128| -> io::Result<()> {
        // SAFETY: every buffer an entry's command points to (its iovecs, header and payload)
        // is owned by `shared`, which outlives this function; the wake word lives until its
        // read completes (see the end of this function).
        push_or_flush(ring, |ring| unsafe { ring.push(sqe) })
    };
    let register = |ring: &mut Ring, i: usize| -> io::Result<()> {
        let cmd = abi::UringCmdReq {
            qid: config.qid,
            ..Default::default()
        };
        let mut sqe = Sqe128::uring_cmd(dev, uring_cmd::REGISTER, cmd.as_bytes(), i as u64);
        sqe.addr = shared.entry(i as u64).iov.as_ptr() as u64;
        sqe.len = 2;
        push(ring, &sqe)
    };
    // Makes one more entry and registers it; false (logged) when none can be made.
    let add_entry = |ring: &mut Ring, book: &mut Entries| -> io::Result<bool> {
        let i = book.states.len();
        if i >= MAX_RING_ENTRIES {
            if !book.at_cap {
                book.at_cap = true;
                tracing::warn!(
                    qid = config.qid,
                    parked = book.parked,
                    "this CPU's ring has reached its {MAX_RING_ENTRIES} entries: requests \
                     parked from now on keep their entries unreplaced, and once all are \
                     parked this CPU's new requests wait for one to be answered"
                );
            }
            return Ok(false);
        }
        let entry = match EntryBuffers::new(config.payload_bytes) {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(qid = config.qid, "cannot map a ring entry's buffer: {e}");
                return Ok(false);
            }
        };
        if shared.entries[i].set(entry).is_err() {
            return Err(io::Error::other("a ring was served twice"));
        }
        book.push();
        register(ring, i)?;
        Ok(true)
    };
    let commit = |ring: &mut Ring, i: usize, commit_id: u64| -> io::Result<()> {
        let cmd = abi::UringCmdReq {
            commit_id,
            qid: config.qid,
            ..Default::default()
        };
        let sqe = Sqe128::uring_cmd(dev, uring_cmd::COMMIT_AND_FETCH, cmd.as_bytes(), i as u64);
        push(ring, &sqe)
    };
    let arm_wake = |ring: &mut Ring, word: &mut u64| -> io::Result<()> {
        let sqe = Sqe128::read(
            shared.wake.as_raw_fd(),
            (word as *mut u64).cast(),
            8,
            WAKE_TAG,
        );
        push(ring, &sqe)
    };

    SERVING.with(|s| s.borrow_mut().0 = Arc::as_ptr(shared));
    let mut wake_pending = false;
    let mut connection_ended = false;
    let mut topped_up = config.online;
    let mut completions: Vec<Cqe> = Vec::with_capacity(depth + 1);
    let mut answered: Vec<u16> = Vec::with_capacity(depth);
    let mut poll = PollBudget::new(config.poll);

    let result = (|| -> io::Result<()> {
        for _ in 0..first_entries {
            if !add_entry(&mut ring, &mut book)? {
                return Err(io::Error::other("cannot make this ring's first entries"));
            }
        }
        arm_wake(&mut ring, &mut wake_word)?;
        wake_pending = true;
        loop {
            submit_and_await(&mut ring, &mut poll)?;
            completions.clear();
            ring.reap(&mut completions);
            if !completions.is_empty() {
                shared.kicker.progress.fetch_add(1, Ordering::Relaxed);
            }
            let mut parked_now = false;
            for cqe in &completions {
                if cqe.user_data == WAKE_TAG {
                    wake_pending = false;
                    answered.extend(
                        shared
                            .deferred
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .drain(..),
                    );
                    continue;
                }
                let i = cqe.user_data as usize;
                match -cqe.res {
                    0 => {
                        if !topped_up {
                            // The first request on a ring that started with one entry: its
                            // CPU is online now. Serve it from there, with the full depth.
                            topped_up = true;
                            if let Err(e) = topology::pin_current_thread(config.qid as usize) {
                                tracing::debug!(qid = config.qid, "pinning: {e}");
                            }
                            while book.live < depth && add_entry(&mut ring, &mut book)? {}
                        }
                        book.set(i, EntryState::Answering);
                        let (commit_id, dispatched, request_payload) = serve_entry(
                            fs,
                            wire,
                            shared.entry(i as u64),
                            request_words.as_mut_bytes(),
                            queue,
                            i,
                        );
                        book.commit_ids[i] = commit_id;
                        book.touched[i] = book.touched[i].max(request_payload);
                        if dispatched == Dispatched::Parked {
                            parked_now = true;
                            book.set(i, EntryState::Parked);
                            book.parked += 1;
                            if book.live - book.parked < depth && add_entry(&mut ring, &mut book)? {
                                // Into the kernel now, not after the batch: the queue may be
                                // out of free entries until it is there.
                                enter(&mut ring, 0)?;
                            }
                        }
                    }
                    libc::EAGAIN => {
                        // REGISTER before the kernel finished INIT: try again shortly.
                        std::thread::sleep(REGISTER_RETRY);
                        register(&mut ring, i)?;
                    }
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                        book.set(i, EntryState::Ended);
                        book.live -= 1;
                        connection_ended = true;
                    }
                    errno if book.states[i] == EntryState::Registering => {
                        // Refused for good (buffers the kernel finds too small, say): trying
                        // again would spin. The queue goes on with the entries it has.
                        tracing::error!(
                            qid = config.qid,
                            entry = i,
                            "the kernel refused to register a ring entry: {}",
                            io::Error::from_raw_os_error(errno)
                        );
                        book.set(i, EntryState::Ended);
                        book.live -= 1;
                    }
                    errno => {
                        // The kernel dropped the entry (a commit it could not match, say):
                        // give it the buffers again so this CPU's queue keeps its depth.
                        tracing::warn!(
                            qid = config.qid,
                            entry = i,
                            "ring command failed: {}; registering the entry again",
                            io::Error::from_raw_os_error(errno)
                        );
                        book.set(i, EntryState::Registering);
                        register(&mut ring, i)?;
                    }
                }
            }
            SERVING.with(|s| answered.append(&mut s.borrow_mut().1));
            if parked_now && answered.is_empty() && !connection_ended {
                // Nothing to commit, so nothing fetches what the kernel may have queued.
                shared.ask_for_kick(config);
            }
            for i in answered.drain(..) {
                let i = i as usize;
                let entry = shared.entry(i as u64);
                if book.states[i] == EntryState::Parked {
                    book.parked -= 1;
                    book.at_cap = false;
                }
                // SAFETY: the entry's answer was handed back: the worker owns it.
                let answer_len = unsafe {
                    entry.unstage();
                    entry.answer_len()
                };
                let touched = book.touched[i].max(answer_len);
                if i >= depth + SPARES_KEPT_RESIDENT && touched > SPARE_RESIDENT_MAX_BYTES {
                    entry.region.release_from(answer_len);
                    book.touched[i] = answer_len;
                } else {
                    book.touched[i] = touched;
                }
                book.set(i, EntryState::InKernel);
                commit(&mut ring, i, book.commit_ids[i])?;
            }
            if connection_ended && book.in_kernel == 0 {
                // Entries still with the file system get answered into a dead ring: harmless.
                return Ok(());
            }
            if book.live == 0 && !connection_ended {
                // No completion would ever come to end this loop; nothing of ours is in the
                // kernel, so the buffers may go.
                return Err(io::Error::other(
                    "the kernel registered no entry of this ring",
                ));
            }
            if !wake_pending && !connection_ended {
                arm_wake(&mut ring, &mut wake_word)?;
                wake_pending = true;
            }
        }
    })();
    // The eventfd read must complete before its word is freed: poke it and reap it.
    if wake_pending {
        let _ = shared.wake();
        let deadline = Instant::now() + Duration::from_secs(1);
        while wake_pending && Instant::now() < deadline {
            if ring.submit_and_wait(1).is_err() {
                break;
            }
            completions.clear();
            ring.reap(&mut completions);
            wake_pending = !completions.iter().any(|c| c.user_data == WAKE_TAG);
        }
        if wake_pending {
            // Never free memory the kernel may still write.
            std::mem::forget(wake_word);
        }
    }
    SERVING.with(|s| *s.borrow_mut() = (std::ptr::null(), Vec::new()));
    shared.kicker.stop();
    result
}

/// Submits what was pushed and waits for `want` completions, retrying (with a bounded
/// back-off and a log line) when the kernel is short of memory or resources: a passing
/// shortage must not end the CPU's queue, and with it the mount.
fn enter(ring: &mut Ring, want: u32) -> io::Result<()> {
    let mut delay = ENTER_RETRY_FIRST;
    let mut retries = 0u32;
    loop {
        match ring.submit_and_wait(want) {
            Ok(()) => return Ok(()),
            Err(e) if is_transient(&e) => {
                // EBUSY: completions must be reaped before more can be submitted.
                if ring.has_completions() {
                    return Ok(());
                }
                if retries.is_multiple_of(ENTER_RETRY_LOG_EVERY) {
                    tracing::warn!(
                        "io_uring_enter: {e}; retrying in {delay:?} (a passing shortage of \
                         kernel memory or resources)"
                    );
                }
                retries += 1;
                std::thread::sleep(delay);
                delay = (delay * 2).min(ENTER_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Pushes one submission with `push` (which says whether the ring had room), first flushing
/// the submission ring into the kernel while it is full. `enter` can come back without having
/// submitted anything (a signal, or EBUSY while completions wait to be reaped), so the push is
/// retried until it finds room; a ring that stays full for `PUSH_FLUSH_TRIES` flushes is an
/// error, never a submission silently dropped (a lost COMMIT would strand its request and its
/// entry for good).
fn push_or_flush(ring: &mut Ring, mut push: impl FnMut(&mut Ring) -> bool) -> io::Result<()> {
    for _ in 0..PUSH_FLUSH_TRIES {
        if push(ring) {
            return Ok(());
        }
        enter(ring, 0)?;
        if ring.is_full() {
            std::thread::sleep(ENTER_RETRY_FIRST);
        }
    }
    Err(io::Error::other(
        "the io_uring submission queue stayed full: the kernel takes no more submissions",
    ))
}

/// Whether an io_uring_enter failure is a passing shortage worth retrying. EINTR is not one:
/// `Ring::submit_and_wait` already treats it as an early return, not a failure.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::ENOMEM | libc::EBUSY)
    )
}

/// A ring worker's polling window, adapted to what polling buys (issue 12: an idle or
/// oversubscribed machine must not pay for it). The worker polls for up to `max` only while
/// polling pays: a poll that runs out turns it off, and it comes back when a sleep ends
/// within `max` (a poll would have caught that request). A steady stream of round trips
/// keeps it on; an idle mount pays one window after its last request, then nothing; a busy
/// machine, whose requests wait for a CPU longer than the window, stops polling after one
/// miss. The worker's own state: nothing shared, no atomics.
#[derive(Debug)]
struct PollBudget {
    /// `--poll-us`; zero turns polling (and the timing of sleeps) off.
    max: Duration,
    /// The window of the next wait: `max` or zero.
    next: Duration,
}

impl PollBudget {
    fn new(max: Duration) -> PollBudget {
        PollBudget { max, next: max }
    }

    /// A completion came while polling: poll again next time.
    fn caught(&mut self) {
        self.next = self.max;
    }

    /// The window ran out with nothing: sleep at once next time.
    fn missed(&mut self) {
        self.next = Duration::ZERO;
    }

    /// A sleep ended after `slept`: within the window, polling would have caught it.
    fn slept(&mut self, slept: Duration) {
        if slept < self.max {
            self.next = self.max;
        }
    }
}

/// Submits what the last batch queued (commits, registrations, the wake read) and returns
/// once a completion is ready: first polling for `poll`'s window, yielding the CPU between
/// looks, then sleeping in the kernel.
fn submit_and_await(ring: &mut Ring, poll: &mut PollBudget) -> io::Result<()> {
    if !poll.next.is_zero() {
        enter(ring, 0)?;
        let since = Instant::now();
        while !ring.has_completions() && since.elapsed() < poll.next {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        if ring.has_completions() {
            poll.caught();
            return Ok(());
        }
        poll.missed();
    }
    if poll.max.is_zero() {
        return enter(ring, 1);
    }
    let since = Instant::now();
    enter(ring, 1)?;
    poll.slept(since.elapsed());
    Ok(())
}

/// Whether this process may create an io_uring at all: enabling FUSE over io_uring does not
/// make io_uring_setup succeed (kernel.io_uring_disabled, seccomp filters).
pub fn probe_setup() -> io::Result<()> {
    Ring::new(1, 2).map(drop)
}

/// The mount line's explanation of an io_uring_setup failure.
pub fn setup_refused(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (is /proc/sys/kernel/io_uring_disabled set, or a seccomp filter in place?)"
        }
        Some(libc::ENOMEM) => " (RLIMIT_MEMLOCK too low?)",
        Some(libc::ENOSYS) => " (kernel built without io_uring)",
        _ => "",
    };
    format!("this process may not create an io_uring: {e}{hint}")
}

/// Rebuilds the request of entry `i`, dispatches it, and returns its commit id, how it was
/// dispatched, and how many payload bytes the request brought. A request that will get no
/// answer through its Reply is answered EIO here, so that the entry returns to the kernel:
/// an entry never committed would be lost to the queue for good.
fn serve_entry<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    entry: &EntryBuffers,
    request: &mut [u8],
    queue: &Arc<QueueHandle>,
    i: usize,
) -> (u64, Dispatched, usize) {
    // SAFETY: the completion gave the entry to this worker; the kernel is done writing it.
    let header = unsafe { &*entry.header.get() };
    let commit_id = header.ring_ent_in_out.commit_id;
    let in_header_len = size_of::<abi::InHeader>();
    let (in_header, _) =
        abi::InHeader::read_from_prefix(&header.in_out).expect("in_out holds an in header");
    let payload_len = header.ring_ent_in_out.payload_sz as usize;
    let total = in_header.len as usize;
    // The op header sits in op_in and the rest in the payload, so the op header's length is
    // what the total leaves over.
    let op_len = total.checked_sub(in_header_len + payload_len);
    let Some(op_len) = op_len.filter(|&n| {
        n <= abi::URING_OP_IN_OUT_SZ && payload_len <= entry.payload_len() && total <= request.len()
    }) else {
        tracing::error!(
            unique = commit_id,
            len = total,
            payload_len,
            "ring request with inconsistent lengths; answering EIO"
        );
        recycle_with_eio(commit_id, i, in_header.opcode, queue);
        return (commit_id, Dispatched::Answered, 0);
    };
    // A WRITE is served in place (its headers copied in front of its data, which stays where
    // the kernel put it); its 8-byte answer is staged while the handler borrows the data.
    // Every other request is rebuilt in the worker's buffer: without payload that is only
    // the headers (and the entry's payload pages stay untouched until an answer needs them);
    // with one, it is a name or an xattr value, small.
    let in_place = op_len % 8 == 0 && payload_len > 0 && in_header.opcode == abi::opcode::WRITE;
    let dispatched = if in_place {
        // SAFETY: the worker owns the entry; the headers go into the room in front of the
        // payload (prefix_ptr..payload_ptr), which no answer ever writes.
        let request = unsafe {
            let start = entry
                .prefix_ptr()
                .add(PREFIX_BYTES - in_header_len - op_len);
            std::ptr::copy_nonoverlapping(header.in_out.as_ptr(), start, in_header_len);
            std::ptr::copy_nonoverlapping(header.op_in.as_ptr(), start.add(in_header_len), op_len);
            std::slice::from_raw_parts(start, total)
        };
        entry.borrowed.store(true, Ordering::Release);
        let dispatched = dispatch(fs, wire, request, queue, i as u64);
        // The handler has returned: its borrow of the payload is over.
        entry.borrowed.store(false, Ordering::Release);
        dispatched
    } else {
        request[..in_header_len].copy_from_slice(&header.in_out[..in_header_len]);
        request[in_header_len..in_header_len + op_len].copy_from_slice(&header.op_in[..op_len]);
        // SAFETY: the worker owns the entry; payload_len is within the payload buffer
        // (checked above) and the destination is the worker's own request buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                entry.payload_ptr(),
                request[in_header_len + op_len..].as_mut_ptr(),
                payload_len,
            )
        };
        dispatch(fs, wire, &request[..total], queue, i as u64)
    };
    if dispatched == Dispatched::Silent {
        tracing::warn!(
            unique = commit_id,
            op = abi::opcode::name(in_header.opcode),
            "a request that takes no answer came on a ring; answering EIO to recycle the entry"
        );
        recycle_with_eio(commit_id, i, in_header.opcode, queue);
        return (commit_id, Dispatched::Answered, payload_len);
    }
    (commit_id, dispatched, payload_len)
}

/// Answers EIO for entry `i`, so that the kernel gets the entry back for its next request.
fn recycle_with_eio(commit_id: u64, i: usize, opcode: u32, queue: &Arc<QueueHandle>) {
    Reply::new(commit_id, i as u64, opcode, Instant::now(), queue.clone()).error(libc::EIO);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_stops_after_a_miss_and_resumes_when_a_sleep_was_short() {
        let max = Duration::from_micros(50);
        let mut poll = PollBudget::new(max);
        assert_eq!(poll.next, max, "a new worker polls");
        poll.missed();
        assert!(poll.next.is_zero(), "an empty window turns polling off");
        poll.slept(Duration::from_millis(5));
        assert!(
            poll.next.is_zero(),
            "a long sleep: polling would not have helped"
        );
        poll.slept(Duration::from_micros(20));
        assert_eq!(poll.next, max, "a short sleep: a poll would have caught it");
        poll.caught();
        assert_eq!(poll.next, max);
        let mut off = PollBudget::new(Duration::ZERO);
        off.slept(Duration::ZERO);
        assert!(off.next.is_zero(), "--poll-us 0 never polls");
    }

    fn conn(max_write: u32, flags: u64) -> Connection {
        Connection {
            minor: 45,
            flags,
            max_write,
            session_fd: -1,
            per_cpu_queues: true,
        }
    }

    #[test]
    fn payload_buffers_are_as_large_as_the_kernel_requires() {
        // The kernel refuses a REGISTER whose payload buffer is below its max_payload_sz.
        assert_eq!(
            payload_bytes(&conn(1 << 20, init_flags::MAX_PAGES)),
            1 << 20
        );
        assert_eq!(payload_bytes(&conn(4096, init_flags::MAX_PAGES)), 8192);
        assert_eq!(payload_bytes(&conn(6000, init_flags::MAX_PAGES)), 8192);
        assert_eq!(payload_bytes(&conn(12_000, init_flags::MAX_PAGES)), 12_288);
        // Without MAX_PAGES the kernel keeps its default of 32 pages per request.
        assert_eq!(payload_bytes(&conn(4096, 0)), 32 * 4096);
    }

    #[test]
    fn only_an_enabled_kernel_has_no_obstacle() {
        assert_eq!(KernelSupport::Enabled.obstacle(), None);
        let off = KernelSupport::Disabled.obstacle().unwrap();
        assert!(
            off.contains(&format!("echo Y > {ENABLE_PARAMETER}")),
            "{off}"
        );
        assert!(KernelSupport::Missing.obstacle().unwrap().contains("6.14"));
    }

    fn one_entry_ring(payload: usize) -> (Arc<RingShared>, RingSink) {
        let shared = RingShared::new().unwrap();
        assert!(
            shared.entries[0]
                .set(EntryBuffers::new(payload).unwrap())
                .is_ok()
        );
        (shared.clone(), RingSink(shared))
    }

    fn answer(sink: &RingSink, unique: u64, error: i32, payload: &[u8]) -> io::Result<()> {
        let header = abi::OutHeader {
            len: (16 + payload.len()) as u32,
            error,
            unique,
        };
        sink.send(0, &[IoSlice::new(header.as_bytes()), IoSlice::new(payload)])
    }

    fn committed(shared: &RingShared) -> (abi::OutHeader, Vec<u8>) {
        let entry = shared.entry(0);
        // SAFETY: the test plays the worker: the answer was handed back.
        unsafe {
            entry.unstage();
            let header = &*entry.header.get();
            let (out, _) = abi::OutHeader::read_from_prefix(&header.in_out).unwrap();
            let len = header.ring_ent_in_out.payload_sz as usize;
            (
                out,
                std::slice::from_raw_parts(entry.payload_ptr(), len).to_vec(),
            )
        }
    }

    #[test]
    fn answers_land_in_the_entry_or_wait_while_the_request_is_borrowed() {
        let (shared, sink) = one_entry_ring(8192);
        SERVING.with(|s| s.borrow_mut().0 = Arc::as_ptr(&shared));
        answer(&sink, 7, 0, &[1; 4096]).unwrap();
        let (out, payload) = committed(&shared);
        assert_eq!((out.unique, out.error, payload.len()), (7, 0, 4096));

        // A WRITE served in place: its answer must not touch the payload the handler reads.
        let entry = shared.entry(0);
        entry.borrowed.store(true, Ordering::Release);
        answer(
            &sink,
            8,
            0,
            abi::WriteOut {
                size: 4096,
                padding: 0,
            }
            .as_bytes(),
        )
        .unwrap();
        // SAFETY: reading the payload as the handler would, before the worker unstages.
        let untouched = unsafe { *entry.payload_ptr() };
        assert_eq!(
            untouched, 1,
            "the staged answer overwrote the request's data"
        );
        entry.borrowed.store(false, Ordering::Release);
        let (out, payload) = committed(&shared);
        assert_eq!((out.unique, out.error), (8, 0));
        assert_eq!(
            payload,
            abi::WriteOut {
                size: 4096,
                padding: 0
            }
            .as_bytes()
        );

        // Too big for the entry: EIO, and the entry still goes back to the worker.
        assert!(answer(&sink, 9, 0, &vec![0; 8192 + 1]).is_err());
        let (out, payload) = committed(&shared);
        assert_eq!((out.unique, out.error, payload.len()), (9, -libc::EIO, 0));
        assert_eq!(SERVING.with(|s| s.borrow().1.len()), 3);
        SERVING.with(|s| *s.borrow_mut() = (std::ptr::null(), Vec::new()));
    }

    /// A flush that leaves the submission ring full (a signal, or EBUSY with completions
    /// waiting) must make the push try again, and a ring that never takes the submission
    /// must be an error: the old push pushed once after one flush and, in a release build,
    /// dropped the submission when that failed.
    #[test]
    fn a_push_into_a_full_ring_retries_and_then_fails_loudly() {
        let mut ring = Ring::new(1, 2).unwrap();
        let mut refusals = 3;
        push_or_flush(&mut ring, |_| {
            refusals -= 1;
            refusals < 0
        })
        .unwrap();
        assert_eq!(refusals, -1, "pushed on the fourth try");
        assert!(push_or_flush(&mut ring, |_| false).is_err());
    }

    #[test]
    fn only_shortages_are_retried() {
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EBUSY] {
            assert!(
                is_transient(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        for errno in [libc::EBADF, libc::EINVAL, libc::EFAULT, libc::EINTR] {
            assert!(
                !is_transient(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }

    #[test]
    fn reads_fill_the_entry_in_place() {
        let (shared, sink) = one_entry_ring(8192);
        SERVING.with(|s| s.borrow_mut().0 = Arc::as_ptr(&shared));
        let queue = Arc::new(QueueHandle {
            sink: Box::new(sink),
            stats: crate::stats::QueueStats::new(0, None, None),
            offload: Arc::new(crate::offload::Offload::new(&topology::Topology::single(1))),
        });
        let entry_payload = shared.entry(0).payload_ptr();
        Reply::new(11, 0, abi::opcode::READ, Instant::now(), queue.clone()).data_with(
            4096,
            |buf| {
                // The file system writes where the kernel will read the answer from.
                assert_eq!(buf.as_ptr(), entry_payload.cast_const());
                assert_eq!(buf.len(), 4096);
                buf[..3].copy_from_slice(b"abc");
                Ok(3)
            },
        );
        let (out, payload) = committed(&shared);
        assert_eq!((out.unique, out.error, out.len), (11, 0, 16 + 3));
        assert_eq!(payload, b"abc");
        // An error still answers through the entry.
        Reply::new(12, 0, abi::opcode::READ, Instant::now(), queue)
            .data_with(4096, |_| Err(libc::EBADF));
        let (out, payload) = committed(&shared);
        assert_eq!(
            (out.unique, out.error, payload.len()),
            (12, -libc::EBADF, 0)
        );
        assert_eq!(SERVING.with(|s| s.borrow().1.len()), 2);
        SERVING.with(|s| *s.borrow_mut() = (std::ptr::null(), Vec::new()));
    }

    #[test]
    fn spare_entries_cost_no_memory_until_used_and_give_it_back() {
        let resident = |region: &PayloadRegion| {
            let page = crate::session::page_bytes();
            let pages = region.payload_len() / page;
            let mut vec = vec![0u8; pages];
            // SAFETY: mincore on our own mapping, with a vector of one byte per page.
            let rc = unsafe {
                libc::mincore(
                    region.payload_ptr().cast(),
                    region.payload_len(),
                    vec.as_mut_ptr(),
                )
            };
            assert_eq!(rc, 0);
            vec.iter().filter(|&&b| b & 1 != 0).count()
        };
        let entry = EntryBuffers::new(1 << 20).unwrap();
        assert_eq!(resident(&entry.region), 0, "a fresh entry is not populated");
        // SAFETY: the test owns the entry; the writes stay inside its payload buffer.
        unsafe { std::ptr::write_bytes(entry.payload_ptr(), 7, 512 * 1024) };
        assert_eq!(resident(&entry.region), 128);
        entry.region.release_from(4096 + 1);
        assert_eq!(resident(&entry.region), 2, "only the answer's pages stay");
    }

    #[test]
    fn inline_answers_stay_on_the_worker_and_others_wake_it() {
        let shared = RingShared::new().unwrap();
        SERVING.with(|s| s.borrow_mut().0 = Arc::as_ptr(&shared));
        hand_back(&shared, 3);
        assert_eq!(SERVING.with(|s| s.borrow().1.clone()), vec![3]);
        assert!(shared.deferred.lock().unwrap().is_empty());
        let other = shared.clone();
        std::thread::spawn(move || hand_back(&other, 5))
            .join()
            .unwrap();
        assert_eq!(*shared.deferred.lock().unwrap(), vec![5]);
        let mut count = 0u64;
        // SAFETY: an 8-byte read into a live u64 from our eventfd.
        let n = unsafe { libc::read(shared.wake.as_raw_fd(), (&raw mut count).cast(), 8) };
        assert_eq!(
            (n, count),
            (8, 1),
            "the deferred answer wakes the worker once"
        );
        SERVING.with(|s| *s.borrow_mut() = (std::ptr::null(), Vec::new()));
    }
}
