//! The passthrough's own counters, shown by `lanefs stats` next to the engine's.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Counters {
    /// GETXATTR requests: with kernel passthrough and no HANDLE_KILLPRIV_V2, every write
    /// costs one (security.capability); this shows whether that round trip is gone.
    pub getxattr: AtomicU64,
    /// Backing ids registered with FUSE_DEV_IOC_BACKING_OPEN, in all.
    pub backing_opened: AtomicU64,
    /// Backing ids currently registered.
    pub backing_live: AtomicU64,
    /// Opens that wanted passthrough and got another mode (a backing open failed, or the
    /// inode had page-cache opens).
    pub passthrough_declined: AtomicU64,
    /// Writes and truncates where we had the host strip set-user-id bits (KILLPRIV_V2).
    pub kill_suidgid: AtomicU64,
    /// Writes and truncates by callers without CAP_FSETID that had to fstat the file for its
    /// set-ID bits (the inode had not seen its mode within the attribute timeout).
    pub set_id_checks: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
