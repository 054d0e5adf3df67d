//! A minimal io_uring: one ring with 128-byte submission entries (what FUSE's
//! IORING_OP_URING_CMD needs for its 80-byte command area), driven by the one thread that
//! owns it. Only what the FUSE transport uses: push an entry, submit and wait, drain the
//! completions.
//!
//! Written against the kernel ABI (include/uapi/linux/io_uring.h) rather than a crate because
//! the FUSE REGISTER command needs `sqe->len` (the iovec count) set on a URING_CMD entry, which
//! the io-uring crate's `UringCmd80` builder does not expose.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout};

/// `IORING_SETUP_SQE128`: 128-byte submission entries. The only flag that changes how the
/// ring runs (CQSIZE below only sizes it): measured on the
/// 2-vCPU VM (null, 4k psync), SINGLE_ISSUER|DEFER_TASKRUN gave +5% at 1 job but -20% at 2
/// jobs, and COOP_TASKRUN(+TASKRUN_FLAG) stayed within noise (libfuse found both slower too).
const SETUP_SQE128: u32 = 1 << 10;
/// `IORING_SETUP_CQSIZE`: the completion ring's size is `cq_entries`, not twice the
/// submission ring's.
const SETUP_CQSIZE: u32 = 1 << 3;
/// `IORING_ENTER_GETEVENTS`: wait for completions.
const ENTER_GETEVENTS: u32 = 1;
/// mmap offsets of the submission ring, the completion ring and the entry array.
const OFF_SQ_RING: i64 = 0;
const OFF_CQ_RING: i64 = 0x0800_0000;
const OFF_SQES: i64 = 0x1000_0000;

/// io_uring opcodes the transport uses.
pub mod op {
    pub const READ: u8 = 22;
    pub const URING_CMD: u8 = 46;
}

/// `struct io_sqring_offsets`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, Immutable, KnownLayout, zerocopy::FromBytes)]
struct SqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

/// `struct io_cqring_offsets`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, Immutable, KnownLayout, zerocopy::FromBytes)]
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

/// `struct io_uring_params`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, Immutable, KnownLayout, zerocopy::FromBytes)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}

/// `struct io_uring_sqe` of a ring set up with SQE128: the 64-byte entry whose trailing
/// 16 bytes begin the URING_CMD command area, continued by the second 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, Immutable, KnownLayout, zerocopy::FromBytes)]
pub struct Sqe128 {
    pub opcode: u8,
    pub flags: u8,
    pub ioprio: u16,
    pub fd: i32,
    /// `off` for reads; for URING_CMD the low half is `cmd_op`.
    pub off: u64,
    pub addr: u64,
    pub len: u32,
    pub op_flags: u32,
    pub user_data: u64,
    pub buf_index: u16,
    pub personality: u16,
    pub file_index: i32,
    /// URING_CMD's command area (80 bytes with SQE128); `addr3` and padding otherwise.
    pub cmd: [u8; 80],
}

/// `struct io_uring_cqe` (16 bytes; the ring is not set up with CQE32).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, Immutable, KnownLayout, zerocopy::FromBytes)]
pub struct Cqe {
    pub user_data: u64,
    pub res: i32,
    pub flags: u32,
}

const _: () = {
    assert!(size_of::<Params>() == 120);
    assert!(size_of::<Sqe128>() == 128);
    assert!(size_of::<Cqe>() == 16);
};

impl Sqe128 {
    /// An IORING_OP_URING_CMD entry on `fd` with command `cmd_op` and its command bytes.
    pub fn uring_cmd(fd: RawFd, cmd_op: u32, cmd: &[u8], user_data: u64) -> Sqe128 {
        let mut sqe = Sqe128::new_zeroed();
        sqe.opcode = op::URING_CMD;
        sqe.fd = fd;
        sqe.off = cmd_op as u64;
        sqe.user_data = user_data;
        sqe.cmd[..cmd.len()].copy_from_slice(cmd);
        sqe
    }

    /// An IORING_OP_READ entry of `len` bytes into `addr` from the file's current position.
    pub fn read(fd: RawFd, addr: *mut u8, len: u32, user_data: u64) -> Sqe128 {
        let mut sqe = Sqe128::new_zeroed();
        sqe.opcode = op::READ;
        sqe.fd = fd;
        sqe.off = u64::MAX;
        sqe.addr = addr as u64;
        sqe.len = len;
        sqe.user_data = user_data;
        sqe
    }
}

/// A shared mapping of part of the ring, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, offset: i64) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of the ring fd; the kernel checks offset and length.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// A pointer `offset` bytes into the mapping, as the kernel's offsets describe it.
    fn at<T>(&self, offset: u32) -> *mut T {
        debug_assert!(offset as usize + size_of::<T>() <= self.len);
        // SAFETY: offset lies within the mapping (the kernel's own offsets for this ring).
        unsafe { self.ptr.add(offset as usize).cast() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are a mapping made by Mapping::new and not yet unmapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One io_uring, owned by one thread (it is deliberately neither Send nor Sync: the FUSE
/// kernel side delivers each next request to the task that submitted its fetch).
pub struct Ring {
    fd: OwnedFd,
    sq_ring: Mapping,
    cq_ring: Mapping,
    sqes: Mapping,
    sq_mask: u32,
    sq_entries: u32,
    cq_mask: u32,
    sq_off: SqOffsets,
    cq_off: CqOffsets,
    /// Our copy of the submission tail (the shared one is published by `publish`).
    sq_tail: u32,
}

impl Ring {
    /// A ring of at least `entries` submission slots with 128-byte entries, and room for at
    /// least `completions` completions at once (never less than twice `entries`).
    pub fn new(entries: u32, completions: u32) -> io::Result<Ring> {
        let entries = entries.max(1).next_power_of_two();
        let completions = completions.max(2 * entries).next_power_of_two();
        let mut params = Params {
            flags: SETUP_SQE128 | SETUP_CQSIZE,
            cq_entries: completions,
            ..Default::default()
        };
        // SAFETY: params is a valid io_uring_params the kernel fills in.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_io_uring_setup,
                entries,
                &mut params as *mut Params,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: io_uring_setup returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let raw = fd.as_raw_fd();
        let sq_len = params.sq_off.array as usize + params.sq_entries as usize * 4;
        let cq_len = params.cq_off.cqes as usize + params.cq_entries as usize * size_of::<Cqe>();
        let sq_ring = Mapping::new(raw, sq_len, OFF_SQ_RING)?;
        let cq_ring = Mapping::new(raw, cq_len, OFF_CQ_RING)?;
        let sqes = Mapping::new(
            raw,
            params.sq_entries as usize * size_of::<Sqe128>(),
            OFF_SQES,
        )?;
        // SAFETY: the offsets come from the kernel for these mappings; ring_mask and
        // ring_entries are u32 fields the kernel wrote before returning.
        let (sq_mask, cq_mask) = unsafe {
            (
                *sq_ring.at::<u32>(params.sq_off.ring_mask),
                *cq_ring.at::<u32>(params.cq_off.ring_mask),
            )
        };
        // The indirection array maps slot i to entry i once and for all.
        let array = sq_ring.at::<u32>(params.sq_off.array);
        for i in 0..params.sq_entries {
            // SAFETY: the array has sq_entries u32 slots inside the SQ mapping.
            unsafe { array.add(i as usize).write(i) };
        }
        let ring = Ring {
            fd,
            sq_mask,
            sq_entries: params.sq_entries,
            cq_mask,
            sq_off: params.sq_off,
            cq_off: params.cq_off,
            sq_tail: 0,
            sq_ring,
            cq_ring,
            sqes,
        };
        ring.sq_tail_atomic().store(0, Ordering::Release);
        Ok(ring)
    }

    fn sq_head_atomic(&self) -> &AtomicU32 {
        // SAFETY: the head is an aligned u32 in the SQ mapping the kernel updates atomically;
        // the mapping lives as long as self.
        unsafe { AtomicU32::from_ptr(self.sq_ring.at(self.sq_off.head)) }
    }

    fn sq_tail_atomic(&self) -> &AtomicU32 {
        // SAFETY: as above, for the tail (written by us, read by the kernel).
        unsafe { AtomicU32::from_ptr(self.sq_ring.at(self.sq_off.tail)) }
    }

    fn cq_head_atomic(&self) -> &AtomicU32 {
        // SAFETY: as above, for the CQ head (written by us, read by the kernel).
        unsafe { AtomicU32::from_ptr(self.cq_ring.at(self.cq_off.head)) }
    }

    fn cq_tail_atomic(&self) -> &AtomicU32 {
        // SAFETY: as above, for the CQ tail (written by the kernel).
        unsafe { AtomicU32::from_ptr(self.cq_ring.at(self.cq_off.tail)) }
    }

    /// Queues one entry for the next `submit_and_wait`. Returns false when the ring is full.
    ///
    /// # Safety
    /// Every buffer the entry points to (iovecs, header and payload buffers, read targets)
    /// must stay valid and unaliased by Rust references until its completion is reaped.
    pub unsafe fn push(&mut self, sqe: &Sqe128) -> bool {
        let head = self.sq_head_atomic().load(Ordering::Acquire);
        if self.sq_tail.wrapping_sub(head) >= self.sq_entries {
            return false;
        }
        let slot = self.sq_tail & self.sq_mask;
        // SAFETY: slot < sq_entries, so the entry lies inside the SQE mapping; the kernel
        // does not read it until the tail is published past it.
        unsafe {
            self.sqes
                .ptr
                .cast::<Sqe128>()
                .add(slot as usize)
                .write(*sqe)
        };
        self.sq_tail = self.sq_tail.wrapping_add(1);
        self.sq_tail_atomic().store(self.sq_tail, Ordering::Release);
        true
    }

    /// Submits what was pushed and waits until at least `want` completions are ready.
    /// A signal ends the wait early (EINTR is not an error: the caller reaps and loops).
    pub fn submit_and_wait(&mut self, want: u32) -> io::Result<()> {
        let pending = self
            .sq_tail
            .wrapping_sub(self.sq_head_atomic().load(Ordering::Acquire));
        // SAFETY: io_uring_enter on our ring fd with no signal mask.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                self.fd.as_raw_fd(),
                pending,
                want,
                ENTER_GETEVENTS,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether every submission slot is taken (pushed, not yet submitted).
    pub fn is_full(&self) -> bool {
        self.sq_tail
            .wrapping_sub(self.sq_head_atomic().load(Ordering::Acquire))
            >= self.sq_entries
    }

    /// Whether a completion is ready to reap (no syscall).
    pub fn has_completions(&self) -> bool {
        self.cq_head_atomic().load(Ordering::Relaxed)
            != self.cq_tail_atomic().load(Ordering::Acquire)
    }

    /// Moves every ready completion into `out`.
    pub fn reap(&mut self, out: &mut Vec<Cqe>) {
        let mut head = self.cq_head_atomic().load(Ordering::Relaxed);
        let tail = self.cq_tail_atomic().load(Ordering::Acquire);
        let cqes = self.cq_ring.at::<Cqe>(self.cq_off.cqes);
        while head != tail {
            // SAFETY: entries between head and tail were written by the kernel (the Acquire
            // load of the tail orders the reads) and lie within the CQ mapping.
            out.push(unsafe { cqes.add((head & self.cq_mask) as usize).read() });
            head = head.wrapping_add(1);
        }
        self.cq_head_atomic().store(head, Ordering::Release);
    }
}
