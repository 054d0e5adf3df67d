//! Access times on the volume (issue 17 item 3): reads and listings move atime by the
//! mount's rule (noatime, relatime, strictatime, nodiratime; a read-only mount counts as
//! noatime), exactly as the kernel decides for its own file systems, in the volume's records.
//!
//! FUSE inodes are S_NOATIME: the kernel moves no atime itself and tells us of no read it
//! serves from its page cache. So an open after which the next read must move atime (by the
//! rule, from the inode's times at the open) is answered without FOPEN_KEEP_CACHE, which
//! makes the kernel drop the file's cached pages and send that read here, and carries
//! [`FH_ATIME_DUE`] in its handle so that its reads check the rule. Under strictatime every
//! open is so answered. The atime is committed before the read is answered, so a stat right
//! after it sees the new time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use lanefs_fuse::Reply;
use lanefs_fuse::abi::{self, fopen};
use lanefs_fuse::atime::{Atime, AtimeRule};
use lanefs_fuse::fileattr::FS_NOATIME_FL;

use super::VolumeFs;
use crate::meta::*;
use crate::now_ns;

/// In an open's fh: its reads may have to move atime.
pub(super) const FH_ATIME_DUE: u64 = 1;

/// The mount's atime flags ([`Atime::to_bits`]); a remount changes them from the mount
/// table's watcher thread.
#[derive(Clone)]
pub struct AtimeSwitch(Arc<AtomicU8>);

impl AtimeSwitch {
    pub(super) fn new(atime: Atime) -> AtimeSwitch {
        AtimeSwitch(Arc::new(AtomicU8::new(atime.to_bits())))
    }

    pub fn set(&self, atime: Atime) {
        self.0.store(atime.to_bits(), Ordering::Relaxed)
    }

    pub(super) fn get(&self) -> Atime {
        Atime::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl VolumeFs {
    /// The handle of the mount's atime flags, for following remounts.
    pub fn atime_switch(&self) -> AtimeSwitch {
        self.atime.clone()
    }

    /// Whether an access now moves `rec`'s atime (its times as the kernel sees them).
    fn atime_moves(&self, rec: &InodeRec, now: i64) -> bool {
        let mtime = self
            .open
            .get(rec.ino)
            .and_then(|state| state.dirty_mtime())
            .unwrap_or(rec.mtime_ns);
        let ctime = rec.ctime_ns.max(mtime);
        self.fileattrs.get(rec.ino) & FS_NOATIME_FL == 0
            && self
                .atime
                .get()
                .moves(rec.is_dir(), rec.atime_ns, mtime, ctime, now)
    }

    /// At an open of `rec`: whether its reads may move atime (then the open must not keep
    /// the page cache, and its fh carries [`FH_ATIME_DUE`]).
    pub(super) fn atime_due_at_open(&self, rec: &InodeRec) -> bool {
        match self.atime.get().rule {
            AtimeRule::Never => false,
            AtimeRule::Always => true,
            AtimeRule::Relative => self.atime_moves(rec, now_ns()),
        }
    }

    /// The answer to an open of `rec` with `flags`: without FOPEN_KEEP_CACHE and with
    /// [`FH_ATIME_DUE`] when its reads may move atime.
    pub(super) fn open_out(&self, rec: &InodeRec, flags: u32) -> abi::OpenOut {
        let mut open_flags = self.open_flags(flags);
        let mut fh = 0;
        if self.atime_due_at_open(rec) {
            open_flags &= !fopen::KEEP_CACHE;
            fh = FH_ATIME_DUE;
        }
        abi::OpenOut {
            fh,
            open_flags,
            backing_id: 0,
        }
    }

    /// Answers a read of `ino` with `bytes`, first moving its atime if the rule says so.
    pub(super) fn reply_read(&self, queue: usize, ino: u64, fh: u64, bytes: Vec<u8>, reply: Reply) {
        if fh & FH_ATIME_DUE == 0 {
            return reply.data(&bytes);
        }
        let now = now_ns();
        let moves = match self.store.getattr(queue, ino) {
            Ok(rec) => self.atime_moves(&rec, now),
            Err(_) => false,
        };
        if !moves {
            return reply.data(&bytes);
        }
        self.store.touch_atime(
            ino,
            now,
            Box::new(move |r| {
                if let Err(e) = r {
                    tracing::warn!(
                        "volume: moving the atime of inode {ino}: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                }
                reply.data(&bytes)
            }),
        )
    }

    /// Answers a READDIR of `dir` (listed from `rec`) with `bytes`, first moving its atime
    /// if the rule says so.
    pub(super) fn reply_listing(&self, rec: Option<&InodeRec>, bytes: &[u8], reply: Reply) {
        let now = now_ns();
        let Some(rec) = rec.filter(|rec| self.atime_moves(rec, now)) else {
            return reply.data(bytes);
        };
        let ino = rec.ino;
        let bytes = bytes.to_vec();
        self.store.touch_atime(
            ino,
            now,
            Box::new(move |r| {
                if let Err(e) = r {
                    tracing::warn!(
                        "volume: moving the atime of directory {ino}: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                }
                reply.data(&bytes)
            }),
        )
    }
}
