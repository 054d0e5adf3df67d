//! The FUSE-over-io_uring transport (Linux 6.14+): one ring per possible CPU, each served by
//! a worker pinned to that CPU. The kernel queues a request on the ring of the CPU its caller
//! runs on, so a request and its answer stay on one CPU.
//!
//! A ring has `depth` entries. Each entry is a pair of buffers registered with the kernel (a
//! 288-byte `UringReqHeader` and a payload buffer of the connection's largest payload),
//! allocated by the worker after it is pinned, so the pages come from its own NUMA node. An
//! entry cycles: REGISTER (or COMMIT_AND_FETCH) is in the kernel → its completion carries a
//! request → the file system answers through a [`Reply`](crate::Reply) → the answer is written
//! into the entry's buffers → the worker submits COMMIT_AND_FETCH, which hands the answer to
//! the kernel and waits for the next request in one step. Requests are served where the
//! kernel put them (the headers are copied in front of the payload), except small ones with
//! a name or xattr payload, which are copied out first; see `serve_entry`.
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
//! file system that may block (on a disk, a network) should keep the `Reply` and answer from
//! its own thread: the entry stays with the request and the worker goes on serving
//! (`Connection::per_cpu_queues` tells a file system it runs over rings).

use std::cell::{RefCell, UnsafeCell};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::abi::{self, init_flags, uring_cmd};
use crate::dispatch::{Dispatched, dispatch};
use crate::filesystem::{Connection, Filesystem};
use crate::reply::{QueueHandle, Reply, ReplySink};
use crate::request::WireFormat;
use crate::ring::{Cqe, Ring, Sqe128};

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
/// 14.0k/s) instead of starving the callers.
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

/// Room before the payload for a request's in header and op header, so that a request can be
/// laid out contiguously, as /dev/fuse delivers it, in front of its payload without moving
/// the payload (8-byte aligned: every op header's size is a multiple of 8).
const PREFIX_BYTES: usize = size_of::<abi::InHeader>() + abi::URING_OP_IN_OUT_SZ;
/// The largest answer that can wait in an entry's staging area (see `EntryBuffers::staged`):
/// an out header and a WRITE's answer, with room to spare.
const STAGE_BYTES: usize = 64;

/// An answer written while its request still borrowed the payload buffer.
struct StagedAnswer {
    /// Bytes used in `bytes`: the out header, then the answer's payload. 0: nothing staged.
    len: usize,
    bytes: [u8; STAGE_BYTES],
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
    header: Box<UnsafeCell<abi::UringReqHeader>>,
    /// `PREFIX_BYTES` of room for a request's headers, then the payload buffer the kernel
    /// knows. Words, so that everything in it is 8-byte aligned like the argument structs.
    region: Box<[UnsafeCell<u64>]>,
    /// Set by the worker while a handler runs on a request whose payload lies in the payload
    /// buffer (a WRITE served in place); cleared (Release) when the handler has returned.
    borrowed: AtomicBool,
    staged: UnsafeCell<StagedAnswer>,
}

// SAFETY: access follows the ownership protocol above: at any time one party (kernel, worker,
// or the one Reply of the entry's request) owns the buffers, and ownership moves between
// threads through the deferred-list mutex or the worker's own thread; `borrowed` (Acquire
// against the worker's Release) tells a Reply whether the handler is done with the payload.
unsafe impl Sync for EntryBuffers {}

impl EntryBuffers {
    /// Allocated by the pinned worker. Every word is written here, so every page is first
    /// touched on the worker's CPU and comes from its node.
    fn new(payload_bytes: usize) -> EntryBuffers {
        EntryBuffers {
            header: Box::new(UnsafeCell::new(abi::UringReqHeader::new_zeroed())),
            region: (0..(PREFIX_BYTES + payload_bytes).div_ceil(8))
                .map(|_| UnsafeCell::new(0))
                .collect(),
            borrowed: AtomicBool::new(false),
            staged: UnsafeCell::new(StagedAnswer {
                len: 0,
                bytes: [0; STAGE_BYTES],
            }),
        }
    }

    fn region_ptr(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.region.as_ptr()).cast()
    }

    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: the region is PREFIX_BYTES longer than the payload buffer.
        unsafe { self.region_ptr().add(PREFIX_BYTES) }
    }

    fn payload_len(&self) -> usize {
        self.region.len() * 8 - PREFIX_BYTES
    }

    /// Writes an answer (out header, then payload parts) into the header and payload buffer.
    ///
    /// # Safety
    /// The caller owns the entry and no handler borrows its payload buffer; the parts fit it.
    unsafe fn write_answer(&self, out_header: &[u8], parts: &[IoSlice<'_>]) {
        // SAFETY: per the contract, the header and payload are ours to write; the parts are
        // caller memory, never the ring's buffers, and fit the payload buffer.
        unsafe {
            let header = &mut *self.header.get();
            header.in_out[..out_header.len()].copy_from_slice(out_header);
            let mut at = self.payload_ptr();
            let mut total = 0;
            for part in parts {
                std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                at = at.add(part.len());
                total += part.len();
            }
            header.ring_ent_in_out.payload_sz = total as u32;
        }
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
}

/// The state of one ring that the replies of its requests share with its worker.
pub struct RingShared {
    /// The entries' buffers, set once by the worker after it is pinned.
    entries: OnceLock<Box<[EntryBuffers]>>,
    /// Entries answered on threads other than the worker, waiting to be committed.
    /// Lock: one per ring, taken only by such deferred replies and by the worker when the
    /// eventfd wakes it; a leaf (nothing is locked while holding it). Inline replies never
    /// take it.
    deferred: Mutex<Vec<u16>>,
    /// Written by a deferred reply to wake the worker (an eventfd).
    wake: OwnedFd,
}

impl RingShared {
    pub fn new() -> io::Result<Arc<RingShared>> {
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(RingShared {
            entries: OnceLock::new(),
            deferred: Mutex::new(Vec::new()),
            // SAFETY: eventfd returned a new fd that nothing else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
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
        let entries = shared
            .entries
            .get()
            .expect("a ring's requests come only after its buffers exist");
        let entry = &entries[token as usize];
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
    /// Its request is with the file system, waiting for the Reply.
    Answering,
    /// The connection is gone; the kernel will not use the entry again.
    Ended,
}

/// One ring's settings, fixed at the start.
pub struct RingConfig {
    /// The kernel's queue id: the CPU whose requests this ring carries.
    pub qid: u16,
    pub depth: usize,
    pub payload_bytes: usize,
    /// How long the worker stays awake after a batch before sleeping (see
    /// `DEFAULT_RING_POLL`); zero: it sleeps at once.
    pub poll: Duration,
}

/// Serves one ring until the connection ends. Runs on the ring's worker, already pinned.
pub fn serve_ring<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    dev_fd: &OwnedFd,
    shared: &Arc<RingShared>,
    queue: &Arc<QueueHandle>,
    config: &RingConfig,
) -> io::Result<()> {
    let depth = config.depth.clamp(1, MAX_QUEUE_DEPTH);
    let entries: Box<[EntryBuffers]> = (0..depth)
        .map(|_| EntryBuffers::new(config.payload_bytes))
        .collect();
    if shared.entries.set(entries).is_err() {
        return Err(io::Error::other("a ring was served twice"));
    }
    let entries = shared.entries.get().expect("set above");
    // The iovec pairs REGISTER points at; the kernel reads them while issuing the command.
    let iovecs: Vec<[libc::iovec; 2]> = entries
        .iter()
        .map(|e| {
            [
                libc::iovec {
                    iov_base: e.header.get().cast(),
                    iov_len: size_of::<abi::UringReqHeader>(),
                },
                libc::iovec {
                    iov_base: e.payload_ptr().cast(),
                    iov_len: e.payload_len(),
                },
            ]
        })
        .collect();
    // Where requests with a payload other than a WRITE's (names, xattr values) are rebuilt as
    // /dev/fuse would deliver them, out of the entry, so that the answer can be written into
    // the entry while the handler still borrows the request (see serve_entry).
    let mut request_words =
        vec![
            0u64;
            (size_of::<abi::InHeader>() + abi::URING_OP_IN_OUT_SZ + config.payload_bytes)
                .div_ceil(8)
        ];
    let mut wake_word = Box::new(0u64);
    let mut ring = Ring::new(depth as u32 + 1)?;
    let mut states = vec![EntryState::Registering; depth];
    let mut commit_ids = vec![0u64; depth];
    let dev = dev_fd.as_raw_fd();

    let register = |ring: &mut Ring, i: usize| {
        let cmd = abi::UringCmdReq {
            qid: config.qid,
            ..Default::default()
        };
        let mut sqe = Sqe128::uring_cmd(dev, uring_cmd::REGISTER, cmd.as_bytes(), i as u64);
        sqe.addr = iovecs[i].as_ptr() as u64;
        sqe.len = 2;
        // SAFETY: the iovecs and the buffers they describe live until this function returns,
        // after the last completion of the entry (or the connection's end) is reaped.
        assert!(unsafe { ring.push(&sqe) }, "ring sized for every entry");
    };
    let commit = |ring: &mut Ring, i: usize, commit_id: u64| {
        let cmd = abi::UringCmdReq {
            commit_id,
            qid: config.qid,
            ..Default::default()
        };
        let sqe = Sqe128::uring_cmd(dev, uring_cmd::COMMIT_AND_FETCH, cmd.as_bytes(), i as u64);
        // SAFETY: as for REGISTER: the entry's buffers outlive its commands.
        assert!(unsafe { ring.push(&sqe) }, "ring sized for every entry");
    };
    let arm_wake = |ring: &mut Ring, word: &mut u64| {
        let sqe = Sqe128::read(
            shared.wake.as_raw_fd(),
            (word as *mut u64).cast(),
            8,
            WAKE_TAG,
        );
        // SAFETY: the word is boxed and lives until the read's completion is reaped below.
        assert!(unsafe { ring.push(&sqe) }, "ring sized for every entry");
    };

    SERVING.with(|s| s.borrow_mut().0 = Arc::as_ptr(shared));
    for i in 0..depth {
        register(&mut ring, i);
    }
    arm_wake(&mut ring, &mut wake_word);
    let mut wake_pending = true;
    let mut connection_ended = false;
    let mut completions: Vec<Cqe> = Vec::with_capacity(depth + 1);
    let mut answered: Vec<u16> = Vec::with_capacity(depth);

    let result = loop {
        if let Err(e) = submit_and_await(&mut ring, config.poll) {
            break Err(e);
        }
        completions.clear();
        ring.reap(&mut completions);
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
                    states[i] = EntryState::Answering;
                    commit_ids[i] = serve_entry(
                        fs,
                        wire,
                        &entries[i],
                        request_words.as_mut_bytes(),
                        queue,
                        i,
                    );
                }
                libc::EAGAIN => {
                    // REGISTER before the kernel finished INIT: try again shortly.
                    std::thread::sleep(REGISTER_RETRY);
                    register(&mut ring, i);
                }
                libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                    states[i] = EntryState::Ended;
                    connection_ended = true;
                }
                errno if states[i] == EntryState::Registering => {
                    // Refused for good (buffers the kernel finds too small, say): trying
                    // again would spin. The queue goes on with the entries it has.
                    tracing::error!(
                        qid = config.qid,
                        entry = i,
                        "the kernel refused to register a ring entry: {}",
                        io::Error::from_raw_os_error(errno)
                    );
                    states[i] = EntryState::Ended;
                }
                errno => {
                    // The kernel dropped the entry (a commit it could not match, say): give
                    // it the buffers again so this CPU's queue keeps its depth.
                    tracing::warn!(
                        qid = config.qid,
                        entry = i,
                        "ring command failed: {}; registering the entry again",
                        io::Error::from_raw_os_error(errno)
                    );
                    states[i] = EntryState::Registering;
                    register(&mut ring, i);
                }
            }
        }
        SERVING.with(|s| answered.append(&mut s.borrow_mut().1));
        for i in answered.drain(..) {
            let i = i as usize;
            // SAFETY: the entry's answer was handed back: the worker owns it.
            unsafe { entries[i].unstage() };
            states[i] = EntryState::InKernel;
            commit(&mut ring, i, commit_ids[i]);
        }
        let in_kernel = states
            .iter()
            .filter(|s| matches!(s, EntryState::InKernel | EntryState::Registering))
            .count();
        if connection_ended && in_kernel == 0 {
            // Entries still with the file system get answered into a dead ring: harmless.
            break Ok(());
        }
        if states.iter().all(|s| *s == EntryState::Ended) && !connection_ended {
            // No completion would ever come to end this loop; nothing of ours is in the
            // kernel, so the buffers may go.
            break Err(io::Error::other(
                "the kernel registered no entry of this ring",
            ));
        }
        if !wake_pending && !connection_ended {
            arm_wake(&mut ring, &mut wake_word);
            wake_pending = true;
        }
    };
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
    result
}

/// Submits what the last batch queued (commits, registrations, the wake read) and returns
/// once a completion is ready: first polling for up to `poll`, yielding the CPU between looks,
/// then sleeping in the kernel.
fn submit_and_await(ring: &mut Ring, poll: Duration) -> io::Result<()> {
    if !poll.is_zero() {
        ring.submit_and_wait(0)?;
        let since = Instant::now();
        while !ring.has_completions() && since.elapsed() < poll {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        if ring.has_completions() {
            return Ok(());
        }
    }
    ring.submit_and_wait(1)
}

/// Whether this process may create an io_uring at all: enabling FUSE over io_uring does not
/// make io_uring_setup succeed (kernel.io_uring_disabled, seccomp filters).
pub fn probe_setup() -> io::Result<()> {
    Ring::new(1).map(drop)
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

/// Copies the request out of entry `i`, dispatches it, and returns its commit id. A request
/// that will get no answer through its Reply is answered EIO here, so that the entry returns
/// to the kernel: an entry never committed would be lost to the queue for good.
fn serve_entry<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    entry: &EntryBuffers,
    request: &mut [u8],
    queue: &Arc<QueueHandle>,
    i: usize,
) -> u64 {
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
        return commit_id;
    };
    // In place (the headers copied in front of the payload, which stays where the kernel
    // put it) when the answer cannot land on the request: requests without payload (reads,
    // getattr, ...: the answer goes after the headers) and WRITEs (whose 8-byte answer is
    // staged while the handler borrows the data). Other requests with payload carry names
    // or xattrs, small enough to copy into the worker's buffer.
    let in_place = op_len % 8 == 0 && (payload_len == 0 || in_header.opcode == abi::opcode::WRITE);
    let dispatched = if in_place {
        let start = PREFIX_BYTES - in_header_len - op_len;
        // SAFETY: the worker owns the entry; the headers go into the prefix room in front of
        // the payload (start..PREFIX_BYTES), which no answer ever writes.
        let request = unsafe {
            let region = entry.region_ptr();
            std::ptr::copy_nonoverlapping(header.in_out.as_ptr(), region.add(start), in_header_len);
            std::ptr::copy_nonoverlapping(
                header.op_in.as_ptr(),
                region.add(start + in_header_len),
                op_len,
            );
            std::slice::from_raw_parts(region.add(start), total)
        };
        let borrows_payload = payload_len > 0;
        if borrows_payload {
            entry.borrowed.store(true, Ordering::Release);
        }
        let dispatched = dispatch(fs, wire, request, queue, i as u64);
        if borrows_payload {
            // The handler has returned: its borrow of the payload is over.
            entry.borrowed.store(false, Ordering::Release);
        }
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
    }
    commit_id
}

/// Answers EIO for entry `i`, so that the kernel gets the entry back for its next request.
fn recycle_with_eio(commit_id: u64, i: usize, opcode: u32, queue: &Arc<QueueHandle>) {
    Reply::new(commit_id, i as u64, opcode, Instant::now(), queue.clone()).error(libc::EIO);
}

#[cfg(test)]
mod tests {
    use super::*;

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
            shared
                .entries
                .set(vec![EntryBuffers::new(payload)].into_boxed_slice())
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
        let entry = &shared.entries.get().unwrap()[0];
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
        let entry = &shared.entries.get().unwrap()[0];
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
        assert!(answer(&sink, 9, 0, &vec![0; 8193]).is_err());
        let (out, payload) = committed(&shared);
        assert_eq!((out.unique, out.error, payload.len()), (9, -libc::EIO, 0));
        assert_eq!(SERVING.with(|s| s.borrow().1.len()), 3);
        SERVING.with(|s| *s.borrow_mut() = (std::ptr::null(), Vec::new()));
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
