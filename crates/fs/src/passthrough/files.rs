//! Data operations: open (and the choice between kernel passthrough, page cache and direct
//! I/O), read, write, fsync, fallocate, lseek, copy_file_range, release.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use lanefs_fuse::abi::{self, fopen};
use lanefs_fuse::{Reply, Request};

use super::counters::Counters;
use super::handle::OpenFile;
use super::inode::{Backing, Inode};
use super::sys::{self, SysResult};
use super::{AtimeRule, PassthroughFs};

/// The flags of our host open for a client's open: the kernel's own (O_CREAT, O_EXCL) and
/// O_DIRECT dropped (our buffers are not aligned for it, and the kernel's cache is already
/// bypassed), symlinks never followed (O_NOCTTY is added to every open by `sys`).
pub(super) fn host_open_flags(flags: i32) -> i32 {
    (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_DIRECT)) | libc::O_NOFOLLOW
}

impl PassthroughFs {
    /// The host open of a client's open, without its O_TRUNC (see `complete_open`) and never
    /// waiting for a lease break: when another process holds a lease the host starts the
    /// break and fails with EWOULDBLOCK, and the open is tried again from the mount's wait
    /// list (`locks::LockTable::wait`) rather than wait in a syscall, which would hold a
    /// queue's worker or an offload thread for up to the host's lease-break-time (45 s).
    /// A caller's own O_NONBLOCK open gets that EWOULDBLOCK, as natively.
    pub(super) fn open_host(&self, inode: &Inode, flags: i32) -> SysResult<OwnedFd> {
        let host_flags = host_open_flags(flags) & !libc::O_TRUNC;
        if flags & libc::O_NONBLOCK != 0 {
            return self.open_inode(inode, host_flags);
        }
        let fd = self.open_inode(inode, host_flags | libc::O_NONBLOCK)?;
        sys::clear_nonblocking(&fd)?;
        Ok(fd)
    }

    /// Completes a client's open whose host fd `open_host` gave: an O_TRUNC open truncates
    /// now, under the write gate held exclusively (as a truncate) only for the ftruncate
    /// itself, never while the open waited; stripping set-ID bits as the kernel would for the
    /// caller. A read-only O_TRUNC open (which Linux truncates too) truncates through a
    /// write-only fd of its own.
    pub(super) fn complete_open(
        &self,
        req: &Request,
        inode: &std::sync::Arc<Inode>,
        fd: OwnedFd,
        arg: &abi::OpenIn,
    ) -> SysResult<abi::OpenOut> {
        let flags = arg.flags as i32;
        if flags & libc::O_TRUNC != 0 {
            let kill = self.killpriv_v2() && arg.open_flags & abi::OPEN_KILL_SUIDGID != 0;
            let _gate = inode.gate.exclusive();
            let own;
            let writable = if flags & libc::O_ACCMODE == libc::O_RDONLY {
                own =
                    self.open_inode(inode, libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK)?;
                &own
            } else {
                &fd
            };
            self.killing_privileges(req, inode, (writable, false), kill, || {
                sys::ftruncate(writable, 0)
            })?;
            inode.gate.set_size(0);
        }
        self.finish_open(req, inode, fd, flags, None)
    }

    /// Runs `change` (a write, truncate or O_TRUNC open by a caller without CAP_FSETID, when
    /// `kill`) so that the file loses exactly what the kernel takes from that caller
    /// (setattr_should_drop_suidgid): set-user-ID always; set-group-ID when the file is
    /// group-executable, or else when the caller is outside the file's group (without group
    /// execute the bit means mandatory locking, not a privilege, and a group member keeps
    /// it). The host strips set-user-ID bits and security.capability itself once CAP_FSETID
    /// is dropped, but judges group membership by the daemon's groups, not the caller's (read
    /// from /proc), so the set-group-ID bit of a file without group execute is set right
    /// afterwards. `fd` is any fd of the file (O_PATH when the flag says so). The kernel does
    /// not refetch the mode after a write, so it is told to.
    pub(super) fn killing_privileges<T>(
        &self,
        req: &Request,
        inode: &Inode,
        (fd, is_path_fd): (&OwnedFd, bool),
        kill: bool,
        change: impl FnOnce() -> SysResult<T>,
    ) -> SysResult<T> {
        // A file seen without set-ID bits within the attribute timeout loses nothing to the
        // change (the host still drops security.capability): no fstat, no capset pair. The
        // common write of a non-root caller.
        if !kill || inode.known_without_set_id(self.opts.attr_timeout) {
            return change();
        }
        Counters::bump(&self.counters.set_id_checks);
        let generation = inode.mode_generation();
        let Ok(before) = sys::fstat(fd) else {
            // Without the mode, strip what the host strips for an unprivileged writer.
            let _caps = self.creds.without_fsetid(true)?;
            return change();
        };
        inode.saw_mode(before.st_mode, generation);
        let mode = before.st_mode;
        let group_bit_only_locks = mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP == 0;
        let keeps_group_bit =
            group_bit_only_locks && lanefs_fuse::caller::in_group(req.pid, req.gid, before.st_gid);
        let loses_something =
            mode & libc::S_ISUID != 0 || (mode & libc::S_ISGID != 0 && !keeps_group_bit);
        // Nothing to strip (the common write of a non-root caller, or a group member's write
        // to a set-group-ID file without group execute): with CAP_FSETID the host keeps the
        // bits and still drops security.capability, as it does for any writer. No capset pair.
        if !loses_something {
            return change();
        }
        let result = {
            let _caps = self.creds.without_fsetid(true)?;
            change()?
        };
        if group_bit_only_locks {
            let after = sys::fstat(fd)?;
            if (after.st_mode & libc::S_ISGID != 0) != keeps_group_bit {
                sys::chmod(fd, is_path_fd, (after.st_mode & 0o7777) ^ libc::S_ISGID)?;
            }
        }
        // The bits just changed: the next change looks again.
        inode.forget_mode();
        Counters::bump(&self.counters.kill_suidgid);
        self.invalidate_attrs(inode.nodeid);
        Ok(result)
    }

    /// Decides how the kernel reaches the data of a new open file holding `fd`, records it,
    /// and builds the answer. `mode` is the file's mode when the caller just read it.
    ///
    /// The kernel's rules (fs/fuse/iomode.c): once an inode has a backing id, every open of
    /// it must carry FOPEN_PASSTHROUGH with that id (anything else fails with EIO), and
    /// page-cache opens exclude passthrough ones; FOPEN_DIRECT_IO opens mix with either, and
    /// DIRECT_IO with PASSTHROUGH routes the open's I/O to us while keeping the backing id.
    ///
    /// The kernel writes through a backing file with its registrant's credentials, so a
    /// write open shares the passthrough only when its opener would strip set-ID bits the
    /// same way (root keeps them, others lose them); otherwise its writes come to us.
    pub(super) fn finish_open(
        &self,
        req: &Request,
        inode: &std::sync::Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
        mode: Option<u32>,
    ) -> SysResult<abi::OpenOut> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        // A write through passthrough never reaches us, so we could not strip set-ID bits
        // as the host does for the caller, nor tell the kernel: such opens are served by us.
        let sxid_write = writable
            && self.killpriv_v2()
            && mode
                .map_or_else(|| sys::fstat(&fd).map(|st| st.st_mode), Ok)
                .is_ok_and(|mode| mode & (libc::S_ISUID | libc::S_ISGID) != 0);
        let served_by_us = self.opts.direct_io || sxid_write;
        // O_DIRECT goes through kernel passthrough when the open can have it: the kernel
        // opens its backing file with this open's flags, O_DIRECT included, so direct I/O
        // runs at the host's own speed under the host's own locking. Otherwise (passthrough
        // off or declined, or page-cache opens of the inode exclude it) we serve it, with
        // parallel non-extending writes (seed 000).
        let o_direct = flags & libc::O_DIRECT != 0;
        // Root has CAP_FSETID (the open does not say; uid 0 stands for it).
        let privileged = req.uid == 0;
        let direct_io = if self.opts.parallel_writes {
            fopen::DIRECT_IO | fopen::PARALLEL_DIRECT_WRITES
        } else {
            fopen::DIRECT_IO
        };
        let mut out = abi::OpenOut::default();
        let mut passthrough = false;
        let mut cached = false;
        {
            let mut guard = inode.open_state();
            let state = &mut *guard;
            if let Some(b) = &mut state.backing {
                b.opens += 1;
                b.writers += u32::from(writable);
                inode
                    .passthrough_writers
                    .store(b.writers, Ordering::Relaxed);
                out.backing_id = b.id;
                out.open_flags = fopen::PASSTHROUGH;
                if served_by_us || (writable && b.keeps_set_id != privileged) {
                    out.open_flags |= direct_io;
                }
                passthrough = true;
            } else if served_by_us {
                out.open_flags = direct_io;
            } else if state.cached == 0
                && inode.is_regular()
                && self.passthrough_wanted()
                && let Some(id) = self.register_backing(inode, privileged)
            {
                state.backing = Some(Backing {
                    id,
                    opens: 1,
                    writers: u32::from(writable),
                    keeps_set_id: privileged,
                });
                inode
                    .passthrough_writers
                    .store(u32::from(writable), Ordering::Relaxed);
                out.backing_id = id;
                out.open_flags = fopen::PASSTHROUGH;
                passthrough = true;
            } else {
                if inode.is_regular() && self.passthrough_wanted() {
                    Counters::bump(&self.counters.passthrough_declined);
                }
                if o_direct {
                    out.open_flags = direct_io;
                } else {
                    // The kernel serves cached pages without asking us, so a read that must
                    // move atime (the host's read does, by the mount's rule) needs the
                    // cache dropped at this open.
                    if !self.next_read_moves_atime(&fd) {
                        out.open_flags = fopen::KEEP_CACHE;
                    }
                    state.cached += 1;
                    cached = true;
                }
            }
            state.opens += 1;
        }
        // fuse_flush returns at once for such an open (without writeback cache, which we
        // never ask for): no FLUSH round trip at close(2). Safe because our FLUSH does one
        // thing, releasing the closer's host POSIX locks, and with this option the kernel
        // keeps POSIX locks itself (see `PassthroughOptions::flush_on_close`). Writes have
        // reached the host before they returned; dirty pages of a shared mapping are
        // written back when it is unmapped (fuse_vma_close) or synced.
        if !self.opts.flush_on_close {
            out.open_flags |= fopen::NOFLUSH;
        }
        out.fh = self.files.insert(OpenFile {
            fd,
            inode: inode.clone(),
            flags,
            passthrough,
            cached,
        });
        Ok(out)
    }

    /// Whether the next read of the host file `fd` moves its atime by the FUSE mount's rule
    /// (the kernel's: `atime_needs_update`).
    fn next_read_moves_atime(&self, fd: &OwnedFd) -> bool {
        let atime = super::Atime::from_bits(self.atime.load(Ordering::Relaxed));
        match atime.rule {
            AtimeRule::Never => false,
            AtimeRule::Always => true,
            AtimeRule::Relative => sys::fstat(fd).is_ok_and(|st| {
                let ns = |s: i64, n: i64| s * 1_000_000_000 + n;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64);
                atime.moves(
                    false,
                    ns(st.st_atime, st.st_atime_nsec),
                    ns(st.st_mtime, st.st_mtime_nsec),
                    ns(st.st_ctime, st.st_ctime_nsec),
                    now,
                )
            }),
        }
    }

    /// Tells the kernel to refetch the attributes of `nodeid`.
    pub(super) fn invalidate_attrs(&self, nodeid: u64) {
        if let Some(n) = self.negotiated()
            && let Err(e) = lanefs_fuse::notify::inval_inode_attrs(n.session_fd, nodeid)
        {
            tracing::warn!(nodeid, "invalidating cached attributes failed: {e}");
        }
    }

    fn passthrough_wanted(&self) -> bool {
        self.negotiated().is_some_and(|n| n.passthrough)
            && !self.passthrough_broken.load(Ordering::Relaxed)
    }

    /// Registers the inode's host file as a backing file (FUSE_DEV_IOC_BACKING_OPEN) and
    /// returns its id, or None when the kernel refuses. `keeps_set_id`: register with
    /// CAP_FSETID (for a root opener). The kernel opens its own backing
    /// file per open from the registered file's path, with the open's flags and the
    /// registrant's credentials, so the inode's O_PATH fd serves every access mode.
    fn register_backing(&self, inode: &Inode, keeps_set_id: bool) -> Option<i32> {
        let negotiated = self.negotiated()?;
        let file = self.path_fd(inode).ok()?;
        // The kernel writes through backing files with the credentials of whoever
        // registered them: without CAP_FSETID unless `keeps_set_id`, so that the host
        // strips set-ID bits on write as it would for an unprivileged writer.
        let registered = {
            let _caps = self
                .creds
                .without_fsetid(negotiated.killpriv_v2 && !keeps_set_id)
                .ok()?;
            sys::backing_open(negotiated.session_fd, &file)
        };
        match registered {
            Ok(id) => {
                Counters::bump(&self.counters.backing_opened);
                Counters::bump(&self.counters.backing_live);
                Some(id)
            }
            Err(e) => {
                let permanent = matches!(
                    e,
                    libc::EPERM | libc::EOPNOTSUPP | libc::ENOTTY | libc::ELOOP | libc::EINVAL
                );
                if permanent && !self.passthrough_broken.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "kernel passthrough unavailable ({}): serving file I/O ourselves",
                        std::io::Error::from_raw_os_error(e)
                    );
                }
                None
            }
        }
    }

    pub(super) fn do_release(&self, arg: &abi::ReleaseIn) {
        let Some(file) = self.files.remove(arg.fh) else {
            return;
        };
        let last = {
            let mut state = file.inode.open_state();
            state.opens = state.opens.saturating_sub(1);
            if file.cached {
                state.cached = state.cached.saturating_sub(1);
            }
            if file.passthrough
                && let Some(b) = &mut state.backing
            {
                b.opens -= 1;
                b.writers = b.writers.saturating_sub(u32::from(file.writable()));
                file.inode
                    .passthrough_writers
                    .store(b.writers, Ordering::Relaxed);
                if b.opens == 0 {
                    let id = b.id;
                    state.backing = None;
                    if let Some(n) = self.negotiated()
                        && let Err(e) = sys::backing_close(n.session_fd, id)
                    {
                        tracing::warn!(id, errno = e, "closing a backing id failed");
                    }
                    self.counters.backing_live.fetch_sub(1, Ordering::Relaxed);
                }
            }
            state.opens == 0
        };
        let nodeid = file.inode.nodeid;
        // Closes the open's host fd (unless a request in flight still holds it), which lets
        // go of its flock locks.
        drop(file);
        if last {
            self.locks.release_inode(nodeid);
        } else {
            self.locks.release_handle(nodeid, arg.fh);
        }
    }

    fn file(&self, fh: u64) -> SysResult<std::sync::Arc<OpenFile>> {
        self.files.get(fh).ok_or(libc::EBADF)
    }

    pub(super) fn do_read(&self, _ino: u64, arg: &abi::ReadIn, reply: Reply) {
        let file = match self.file(arg.fh) {
            Ok(file) => file,
            Err(e) => return reply.error(e),
        };
        reply.data_with(arg.size as usize, |buf| {
            sys::pread(&file.fd, buf, arg.offset)
        })
    }

    /// Writes through the inode's write gate. Unless `may_wait`, a write that would wait
    /// for the gate (behind a truncate or an extending write) is not made: None.
    pub(super) fn do_write(
        &self,
        req: &Request,
        arg: &abi::WriteIn,
        data: &[u8],
        may_wait: bool,
    ) -> Option<SysResult<u32>> {
        let file = match self.file(arg.fh) {
            Ok(file) => file,
            Err(e) => return Some(Err(e)),
        };
        let end = arg.offset.saturating_add(data.len() as u64);
        // An O_APPEND write lands at the host's end of file, wherever the kernel thought.
        let parallel = self.opts.parallel_writes && file.flags & libc::O_APPEND == 0;
        let kill = self.killpriv_v2() && arg.write_flags & abi::write_flags::KILL_SUIDGID != 0;
        let _gate = if may_wait {
            file.inode.gate.enter_write(end, parallel)
        } else {
            file.inode.gate.try_enter_write(end, parallel)?
        };
        // The kernel marks a write that must be durable when it returns (an O_SYNC/O_DSYNC
        // open, or a `sync` mount) in its flags.
        let sync = if arg.flags as i32 & libc::O_SYNC == libc::O_SYNC {
            libc::RWF_SYNC
        } else if arg.flags as i32 & libc::O_DSYNC != 0 {
            libc::RWF_DSYNC
        } else {
            0
        };
        let written = self.killing_privileges(req, &file.inode, (&file.fd, false), kill, || {
            if sync == 0 {
                sys::pwrite(&file.fd, data, arg.offset)
            } else {
                sys::pwrite_flags(&file.fd, data, arg.offset, sync)
            }
        });
        Some(written.map(|written| {
            file.inode.gate.written(arg.offset + written as u64);
            written as u32
        }))
    }

    pub(super) fn do_fsync(&self, arg: &abi::FsyncIn) -> SysResult<()> {
        let file = self.file(arg.fh)?;
        sys::fsync(&file.fd, arg.fsync_flags & abi::FSYNC_FDATASYNC != 0)
    }

    /// The kernel's file_modified leaves set-ID bits to us under HANDLE_KILLPRIV_V2 (no flag
    /// says whether the caller has CAP_FSETID: uid 0 stands for it), as for copy_file_range.
    pub(super) fn do_fallocate(&self, req: &Request, arg: &abi::FallocateIn) -> SysResult<()> {
        let file = self.file(arg.fh)?;
        let _gate = file.inode.gate.exclusive();
        let kill = self.killpriv_v2() && req.uid != 0;
        self.killing_privileges(req, &file.inode, (&file.fd, false), kill, || {
            sys::fallocate(&file.fd, arg.mode as i32, arg.offset, arg.length)
        })?;
        if arg.mode as i32 & libc::FALLOC_FL_KEEP_SIZE == 0 {
            file.inode
                .gate
                .written(arg.offset.saturating_add(arg.length));
        }
        Ok(())
    }

    /// Never takes the write gate (seed 002): the host answers from its own state.
    pub(super) fn do_lseek(&self, arg: &abi::LseekIn) -> SysResult<u64> {
        let file = self.file(arg.fh)?;
        sys::lseek(&file.fd, arg.offset, arg.whence as i32)
    }

    pub(super) fn do_copy_file_range(
        &self,
        req: &Request,
        arg: &abi::CopyFileRangeIn,
    ) -> SysResult<u64> {
        let from = self.file(arg.fh_in)?;
        let to = self.file(arg.fh_out)?;
        let end = arg.off_out.saturating_add(arg.len);
        let _gate = to.inode.gate.enter_write(end, self.opts.parallel_writes);
        let kill = self.killpriv_v2() && req.uid != 0;
        let copied = self.killing_privileges(req, &to.inode, (&to.fd, false), kill, || {
            sys::copy_file_range(
                &from.fd,
                arg.off_in,
                &to.fd,
                arg.off_out,
                arg.len,
                arg.flags as u32,
            )
        })?;
        to.inode.gate.written(arg.off_out + copied as u64);
        Ok(copied as u64)
    }

    pub(super) fn do_syncfs(&self, ino: u64) -> SysResult<()> {
        let inode = self.inode(ino)?;
        let fd = self.open_inode(&inode, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK)?;
        sys::syncfs(&fd)
    }
}
