//! File attributes on the volume (issue 17 item 9): the flags `lsattr` shows and `chattr`
//! sets, kept per inode by the store ([`FILEATTR_XATTR`]) and enforced here, since FUSE
//! inodes carry none of them for the kernel to check: immutable refuses every change to the
//! inode and its entries; append-only opens for writing only with O_APPEND, writes nothing
//! before its end, and refuses unlink, rename and changes of mode, owner, size and times. As
//! natively (tmpfs, the generic write path), a descriptor opened for writing before the
//! flag was set keeps writing, but here not over the file's bytes: its writes cannot be
//! told from those of a descriptor that dropped O_APPEND (see `may_write`). The kernel
//! checks the caller before it forwards a change (owner or CAP_FOWNER, CAP_LINUX_IMMUTABLE
//! for immutable and append-only); we check again with the request's uid, root standing
//! for the capabilities.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use lanefs_fuse::abi::{self, fattr};
use lanefs_fuse::fileattr::*;
use lanefs_fuse::{Reply, Request};

use super::{OPEN_SHARDS, VolumeFs};
use crate::meta::*;
use crate::now_ns;

/// The flags the volume keeps, as tmpfs: others are refused with EOPNOTSUPP.
const SUPPORTED_FLAGS: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL;

/// Inodes that have flags, and their flags: loaded at mount, changed by SETFLAGS. On a
/// volume one mount holds, this is the whole truth; on a shared one, another mount's chattr
/// reaches it through the change log (`ChangeKind::Flags`, within its poll), and a SETFLAGS
/// checks its change of immutable and append-only against the store's flags, not these.
pub(super) struct FileAttrs {
    /// Each mutex protects one shard's map; leaf locks, held for one map operation.
    shards: Vec<Mutex<HashMap<u64, u32>>>,
    /// How many inodes have flags: while 0 (nearly always) no check takes a lock.
    flagged: AtomicUsize,
    /// This mount's own SETFLAGS so far, counted before each is applied: a `reload_all`
    /// that one overlapped may have put back the flags from before it.
    set_here: AtomicU64,
}

impl FileAttrs {
    pub(super) fn load(store: &dyn MetaStore) -> FileAttrs {
        let attrs = FileAttrs {
            shards: (0..OPEN_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            flagged: AtomicUsize::new(0),
            set_here: AtomicU64::new(0),
        };
        match store.fileattr_flags() {
            Ok(all) => {
                for (ino, flags) in all {
                    attrs.set(ino, flags);
                }
            }
            Err(e) => tracing::error!(
                "volume: reading file attributes: {} (chattr flags are not enforced)",
                std::io::Error::from_raw_os_error(e)
            ),
        }
        attrs
    }

    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, u32>> {
        self.shards[(ino as usize) % OPEN_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// An inode's flags (0: none).
    pub(super) fn get(&self, ino: u64) -> u32 {
        if self.flagged.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.shard(ino).get(&ino).copied().unwrap_or(0)
    }

    /// Reads `ino`'s flags from the store again (another mount changed them).
    pub(super) fn reload(&self, store: &dyn MetaStore, ino: u64) -> Result<(), Errno> {
        let flags = match store.getxattr(0, ino, FILEATTR_XATTR) {
            Ok(value) => crate::ops::fileattr_flags_of(&value),
            Err(libc::ENODATA | libc::ENOENT) => 0,
            Err(e) => return Err(e),
        };
        self.set(ino, flags);
        Ok(())
    }

    /// Reads every inode's flags from the store again: after the change log could not be
    /// read for a while, whose Flags entries (kept 60 s) may have gone unread. EAGAIN when
    /// a SETFLAGS of this mount overlapped it (it may have put that change's old flags
    /// back): to be run again.
    pub(super) fn reload_all(&self, store: &dyn MetaStore) -> Result<(), Errno> {
        let before = self.set_here.load(Ordering::SeqCst);
        let now: HashMap<u64, u32> = store.fileattr_flags()?.into_iter().collect();
        let gone: Vec<u64> = self
            .shards
            .iter()
            .flat_map(|shard| {
                let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
                shard.keys().copied().collect::<Vec<_>>()
            })
            .filter(|ino| !now.contains_key(ino))
            .collect();
        for ino in gone {
            self.set(ino, 0);
        }
        for (ino, flags) in now {
            self.set(ino, flags);
        }
        if self.set_here.load(Ordering::SeqCst) != before {
            return Err(libc::EAGAIN);
        }
        Ok(())
    }

    /// A SETFLAGS of this mount committed `flags` for `ino`.
    pub(super) fn set_here(&self, ino: u64, flags: u32) {
        self.set_here.fetch_add(1, Ordering::SeqCst);
        self.set(ino, flags);
    }

    fn set(&self, ino: u64, flags: u32) {
        let mut shard = self.shard(ino);
        let had = if flags == 0 {
            shard.remove(&ino).is_some()
        } else {
            shard.insert(ino, flags).is_some()
        };
        match (had, flags != 0) {
            (false, true) => {
                self.flagged.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.flagged.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// EPERM when the inode is immutable or append-only: no unlink, rename, link or xattr
    /// change (may_delete, vfs_link, xattr_permission).
    pub(super) fn may_change_entry(&self, ino: u64) -> Result<(), Errno> {
        if self.get(ino) & GUARD_FLAGS != 0 {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// EPERM when directory `dir` may not gain entries (immutable).
    pub(super) fn may_add_to(&self, dir: u64) -> Result<(), Errno> {
        if self.get(dir) & FS_IMMUTABLE_FL != 0 {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// EPERM when directory `dir` may not lose entries (immutable or append-only).
    pub(super) fn may_remove_from(&self, dir: u64) -> Result<(), Errno> {
        self.may_change_entry(dir)
    }

    /// The open rules (may_open): an immutable file opens for reading only; an append-only
    /// one for writing only with O_APPEND, never with O_TRUNC.
    pub(super) fn may_open(&self, ino: u64, open_flags: u32) -> Result<(), Errno> {
        let flags = self.get(ino);
        if flags & GUARD_FLAGS == 0 {
            return Ok(());
        }
        let open_flags = open_flags as i32;
        let writes = open_flags & libc::O_ACCMODE != libc::O_RDONLY;
        if flags & FS_IMMUTABLE_FL != 0 && (writes || open_flags & libc::O_TRUNC != 0) {
            return Err(libc::EPERM);
        }
        if flags & FS_APPEND_FL != 0
            && ((writes && open_flags & libc::O_APPEND == 0) || open_flags & libc::O_TRUNC != 0)
        {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// A write of an append-only file over its bytes (before its end): EPERM. Natively
    /// F_SETFL and RWF_NOAPPEND refuse to drop O_APPEND on such a file, but a FUSE inode
    /// carries no flag for the kernel to check, so a descriptor opened with O_APPEND could
    /// write anywhere after losing it (and so could a shared writable mapping). Past the end
    /// is allowed: the kernel sends the pieces of one large direct append at once, and a
    /// piece may arrive before the one that ends where it starts.
    pub(super) fn may_write(&self, ino: u64, offset: u64, size: u64) -> Result<(), Errno> {
        if self.get(ino) & FS_APPEND_FL != 0 && offset < size {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// A SETATTR (notify_change): nothing changes an immutable inode; an append-only one
    /// keeps its mode, owner, size and explicit times (its times may move to now).
    pub(super) fn may_setattr(&self, ino: u64, valid: u32) -> Result<(), Errno> {
        let flags = self.get(ino);
        if flags & GUARD_FLAGS == 0 {
            return Ok(());
        }
        let times_set = (valid & fattr::ATIME != 0 && valid & fattr::ATIME_NOW == 0)
            || (valid & fattr::MTIME != 0 && valid & fattr::MTIME_NOW == 0);
        let fixed = valid & (fattr::MODE | fattr::UID | fattr::GID | fattr::SIZE) != 0 || times_set;
        let touch = valid & (fattr::ATIME_NOW | fattr::MTIME_NOW) != 0;
        if fixed || (touch && flags & FS_IMMUTABLE_FL != 0) {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// fallocate (vfs_fallocate): none on an immutable file; only KEEP_SIZE preallocation on
    /// an append-only one.
    pub(super) fn may_fallocate(&self, ino: u64, mode: u32) -> Result<(), Errno> {
        let flags = self.get(ino);
        let keep_size_only = mode as i32 & !libc::FALLOC_FL_KEEP_SIZE == 0;
        if flags & FS_IMMUTABLE_FL != 0 || (flags & FS_APPEND_FL != 0 && !keep_size_only) {
            return Err(libc::EPERM);
        }
        Ok(())
    }
}

impl VolumeFs {
    /// Whether `name` may leave `parent` (unlink, rmdir, the source of a rename).
    pub(super) fn may_unlink(&self, queue: usize, parent: u64, name: &OsStr) -> Result<(), Errno> {
        if self.fileattrs.flagged.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.fileattrs.may_remove_from(parent)?;
        match self.store.lookup(queue, parent, name.as_bytes()) {
            Ok(rec) => self.fileattrs.may_change_entry(rec.ino),
            // The store answers a missing name with the right errno itself.
            Err(_) => Ok(()),
        }
    }

    /// Whether `name` in `parent` may become `newname` in `newparent`, replacing what is
    /// there.
    pub(super) fn may_rename(
        &self,
        queue: usize,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<(), Errno> {
        if self.fileattrs.flagged.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.may_unlink(queue, parent, name)?;
        self.fileattrs.may_add_to(newparent)?;
        match self.store.lookup(queue, newparent, newname.as_bytes()) {
            Ok(replaced) => {
                self.fileattrs.may_remove_from(newparent)?;
                self.fileattrs.may_change_entry(replaced.ino)
            }
            Err(_) => Ok(()),
        }
    }

    /// FUSE_IOCTL: the four file-attribute ioctls; anything else is ENOTTY.
    pub(super) fn fileattr_ioctl(
        &self,
        req: &Request,
        ino: u64,
        arg: &abi::IoctlIn,
        data: &[u8],
        reply: Reply,
    ) {
        let out_max = arg.out_size as usize;
        let flags = self.fileattrs.get(ino);
        match arg.cmd {
            FS_IOC_GETFLAGS => {
                let bytes = flags.to_ne_bytes();
                reply.ioctl(0, &bytes[..bytes.len().min(out_max)])
            }
            FS_IOC_FSGETXATTR => {
                let mut raw = [0u8; FSXATTR_BYTES];
                raw[..4].copy_from_slice(&flags_to_xflags(flags).to_ne_bytes());
                reply.ioctl(0, &raw[..FSXATTR_BYTES.min(out_max)])
            }
            FS_IOC_SETFLAGS => {
                let Some(new) = data.first_chunk::<4>().map(|b| u32::from_ne_bytes(*b)) else {
                    return reply.error(libc::EINVAL);
                };
                self.set_fileattr(req, ino, flags, new, reply)
            }
            FS_IOC_FSSETXATTR => {
                let Some(raw) = data.first_chunk::<FSXATTR_BYTES>() else {
                    return reply.error(libc::EINVAL);
                };
                let word = |at: usize| {
                    u32::from_ne_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]])
                };
                // extsize, projid and cowextsize: the volume has none of them to set.
                if word(4) != 0 || word(12) != 0 || word(16) != 0 {
                    return reply.error(libc::EOPNOTSUPP);
                }
                let Some(new) = xflags_to_flags(word(0)) else {
                    return reply.error(libc::EOPNOTSUPP);
                };
                self.set_fileattr(req, ino, flags, new, reply)
            }
            _ => reply.error(libc::ENOTTY),
        }
    }

    /// Changes `ino`'s flags from `old` to `new`: the owner or root; immutable and
    /// append-only only by root (CAP_LINUX_IMMUTABLE).
    fn set_fileattr(&self, req: &Request, ino: u64, old: u32, new: u32, reply: Reply) {
        if new & !SUPPORTED_FLAGS != 0 {
            return reply.error(libc::EOPNOTSUPP);
        }
        let owner = match self.store.getattr(req.queue, ino) {
            Ok(rec) => rec.uid,
            Err(e) => return reply.error(e),
        };
        let privileged = req.uid == 0;
        if !privileged && (req.uid != owner || (old ^ new) & GUARD_FLAGS != 0) {
            return reply.error(libc::EPERM);
        }
        // The store checks again against its own flags, which another mount may have
        // changed since this mount's copy.
        let set = |done| {
            self.store
                .set_fileattr_flags(ino, new, privileged, now_ns(), done)
        };
        match wait(set) {
            Ok(()) => {
                self.fileattrs.set_here(ino, new);
                reply.ioctl(0, &[])
            }
            Err(e) => reply.error(e),
        }
    }
}
