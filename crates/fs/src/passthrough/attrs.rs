//! Attributes: getattr, setattr, readlink, statfs, access, and the xattr calls.
//! getattr never takes the write gate (seed 002).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use lanefs_fuse::abi::{self, fattr};
use lanefs_fuse::{Reply, Request};

use super::PassthroughFs;
use super::inode::Inode;
use super::sys::{self, SysResult, XattrTarget};

/// The timespec utimensat takes for one of atime/mtime.
fn time_arg(set: bool, now: bool, secs: u64, nsecs: u32) -> libc::timespec {
    if now {
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        }
    } else if set {
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: nsecs as libc::c_long,
        }
    } else {
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        }
    }
}

impl PassthroughFs {
    pub(super) fn do_getattr(&self, ino: u64, fh: Option<u64>) -> SysResult<abi::AttrOut> {
        // An open file answers through its own fd: it works after the file is unlinked.
        if let Some(file) = fh.and_then(|fh| self.files.get(fh)) {
            return self.fresh_attr(&file.inode, &file.fd);
        }
        let inode = self.inode(ino)?;
        self.fresh_attr(&inode, &*self.path_fd(&inode)?)
    }

    /// The attributes answer from a stat of `fd`, an fd of `inode` (borrowed, so that a
    /// getattr touches no reference count beyond the table lookup's).
    fn fresh_attr(&self, inode: &Inode, fd: &OwnedFd) -> SysResult<abi::AttrOut> {
        let generation = inode.mode_generation();
        let st = sys::fstat(fd)?;
        if inode.is_regular() {
            inode.gate.set_size(st.st_size as u64);
        }
        Ok(self.attr_out(inode, &st, generation))
    }

    /// Applies `arg`. A size change without a writable open truncates through `writer`, the
    /// write-only fd `setattr` opened for it (waiting for a host lease break on the wait
    /// list, not here).
    pub(super) fn do_setattr(
        &self,
        req: &Request,
        ino: u64,
        arg: &abi::SetattrIn,
        writer: Option<OwnedFd>,
    ) -> SysResult<abi::AttrOut> {
        let inode = self.inode(ino)?;
        let valid = arg.valid;
        let file = (valid & fattr::FH != 0)
            .then(|| self.files.get(arg.fh))
            .flatten();
        let path = self.path_fd(&inode)?;
        if valid & (fattr::MODE | fattr::UID | fattr::GID) != 0 {
            // Forgotten before the change, so that a stat taken before it is never recorded
            // after it, and again after it (whatever came of it): a stat taken between the
            // first forget and the change (a concurrent getattr or write) saw the old bits
            // under the new generation and may have recorded them; without the second
            // forget a write could trust those stale bits for an attribute timeout and keep
            // a set-ID bit the chmod just set.
            inode.forget_mode();
            let changed = self.change_mode_and_owner(req, &inode, file.as_deref(), &path, arg);
            inode.forget_mode();
            changed?;
        }
        if valid & fattr::SIZE != 0 {
            let kill = self.killpriv_v2() && valid & fattr::KILL_SUIDGID != 0;
            let opened;
            let fd = match (file.as_ref().filter(|f| f.writable()), &writer) {
                (Some(file), _) => &file.fd,
                (None, Some(writer)) => writer,
                // Never waits for a lease break under the gate: EWOULDBLOCK instead.
                (None, None) => {
                    opened = self.open_inode(&inode, super::TRUNCATE_OPEN_FLAGS)?;
                    &opened
                }
            };
            let _gate = inode.gate.exclusive();
            self.killing_privileges(req, &inode, (fd, false), kill, || {
                sys::ftruncate(fd, arg.size)
            })?;
            inode.gate.set_size(arg.size);
        }
        let times = fattr::ATIME | fattr::MTIME | fattr::ATIME_NOW | fattr::MTIME_NOW;
        if valid & times != 0 {
            let ts = [
                time_arg(
                    valid & fattr::ATIME != 0,
                    valid & fattr::ATIME_NOW != 0,
                    arg.atime,
                    arg.atimensec,
                ),
                time_arg(
                    valid & fattr::MTIME != 0,
                    valid & fattr::MTIME_NOW != 0,
                    arg.mtime,
                    arg.mtimensec,
                ),
            ];
            sys::utimens(&path, &ts)?;
        }
        let generation = inode.mode_generation();
        let st = match &file {
            Some(file) => sys::fstat(&file.fd)?,
            None => sys::fstat(&path)?,
        };
        Ok(self.attr_out(&inode, &st, generation))
    }

    /// The mode and owner parts of a setattr.
    fn change_mode_and_owner(
        &self,
        req: &Request,
        inode: &Inode,
        file: Option<&super::handle::OpenFile>,
        path: &std::os::fd::OwnedFd,
        arg: &abi::SetattrIn,
    ) -> SysResult<()> {
        let valid = arg.valid;
        if valid & fattr::MODE != 0 {
            if inode.is_symlink() {
                return Err(libc::EOPNOTSUPP);
            }
            match file {
                Some(file) => sys::chmod(&file.fd, false, arg.mode)?,
                None => sys::chmod(path, true, arg.mode)?,
            }
        }
        if valid & (fattr::UID | fattr::GID) != 0 {
            let uid = if valid & fattr::UID != 0 {
                arg.uid
            } else {
                u32::MAX
            };
            let gid = if valid & fattr::GID != 0 {
                arg.gid
            } else {
                u32::MAX
            };
            // The kernel leaves stripping set-ID bits on chown to us (KILLPRIV_V2); the host
            // strips set-user-ID, and set-group-ID with group execute, for anyone, but keeps
            // a set-group-ID bit without group execute for us (CAP_FSETID) where the kernel
            // keeps it only for a caller in the file's old group (setattr_should_drop_sgid;
            // a root caller stands for one with CAP_FSETID).
            let before = sys::fstat(path)?;
            sys::chown(path, uid, gid)?;
            let mode = before.st_mode;
            if self.killpriv_v2()
                && req.uid != 0
                && mode & libc::S_IFMT != libc::S_IFDIR
                && mode & libc::S_ISGID != 0
                && mode & libc::S_IXGRP == 0
                && !lanefs_fuse::caller::in_group(req.pid, req.gid, before.st_gid)
            {
                sys::chmod(path, true, mode & 0o7777 & !libc::S_ISGID)?;
            }
        }
        Ok(())
    }

    pub(super) fn do_readlink(&self, ino: u64) -> SysResult<Vec<u8>> {
        let inode = self.inode(ino)?;
        sys::readlink(&*self.path_fd(&inode)?)
    }

    pub(super) fn do_statfs(&self, ino: u64) -> SysResult<abi::Kstatfs> {
        let inode = self.inode(ino)?;
        let st = sys::fstatfs(&*self.path_fd(&inode)?)?;
        Ok(abi::Kstatfs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namelen as u32,
            frsize: st.f_frsize as u32,
            ..Default::default()
        })
    }

    pub(super) fn do_access(&self, ino: u64, mask: u32) -> SysResult<()> {
        let inode = self.inode(ino)?;
        sys::access(&*self.path_fd(&inode)?, mask)
    }

    /// Runs an xattr call on the inode: a symlink through its parent and last known name
    /// (checked to still name it), anything else through its own fd.
    fn on_xattr_target<T>(
        &self,
        inode: &Inode,
        call: impl FnOnce(&XattrTarget<'_>) -> SysResult<T>,
    ) -> SysResult<T> {
        if !inode.is_symlink() {
            return call(&XattrTarget::Object(&*self.path_fd(inode)?));
        }
        let (parent, name) = inode.link_name().ok_or(libc::ESTALE)?;
        let dir = self.path_fd(&parent)?;
        let st = sys::fstatat(&dir, &name, 0)?;
        if (st.st_dev, st.st_ino) != (inode.key.dev, inode.key.ino) {
            return Err(libc::ESTALE);
        }
        call(&XattrTarget::Symlink(&dir, &name))
    }

    pub(super) fn do_getxattr(&self, ino: u64, name: &OsStr, size: u32, reply: Reply) {
        let (inode, name) = match self.inode(ino).and_then(|i| Ok((i, xattr_name(name)?))) {
            Ok(found) => found,
            Err(e) => return reply.error(e),
        };
        // The kernel asks for security.capability before every truncate and before the
        // first write after any attribute update (its privilege-stripping check; see
        // ARCHITECTURE.md, KILLPRIV_V2), almost always of files that have none: the answer
        // is remembered for the attribute timeout, as the attributes themselves are.
        let caps = name.as_bytes() == CAPS_XATTR;
        if caps && inode.caps_absent_until.load(Ordering::SeqCst) > self.now_ns() {
            self.counters.caps_from_memory.bump();
            return reply.error(libc::ENODATA);
        }
        let changes = inode.caps_changes.load(Ordering::SeqCst);
        if size == 0 {
            match self.on_xattr_target(&inode, |t| sys::getxattr(t, &name, &mut [])) {
                Ok(n) => reply.xattr_size(n as u32),
                Err(libc::ENODATA) if caps => {
                    self.remember_no_caps(&inode, changes);
                    reply.error(libc::ENODATA)
                }
                Err(e) => reply.error(e),
            }
        } else {
            reply.data_with(size as usize, |buf| {
                self.on_xattr_target(&inode, |t| sys::getxattr(t, &name, buf))
            })
        }
    }

    pub(super) fn do_listxattr(&self, req: &Request, ino: u64, size: u32, reply: Reply) {
        let inode = match self.inode(ino) {
            Ok(inode) => inode,
            Err(e) => return reply.error(e),
        };
        if req.uid != 0 {
            // The host lists trusted.* names to the daemon, which holds CAP_SYS_ADMIN;
            // natively a caller without it never sees them (root stands for it here).
            let list = match self.on_xattr_target(&inode, untrusted_names) {
                Ok(list) => list,
                Err(e) => return reply.error(e),
            };
            return match size {
                0 => reply.xattr_size(list.len() as u32),
                size if list.len() > size as usize => reply.error(libc::ERANGE),
                _ => reply.data(&list),
            };
        }
        if size == 0 {
            match self.on_xattr_target(&inode, |t| sys::listxattr(t, &mut [])) {
                Ok(n) => reply.xattr_size(n as u32),
                Err(e) => reply.error(e),
            }
        } else {
            reply.data_with(size as usize, |buf| {
                self.on_xattr_target(&inode, |t| sys::listxattr(t, buf))
            })
        }
    }

    pub(super) fn do_setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> SysResult<()> {
        let inode = self.inode(ino)?;
        let name = xattr_name(name)?;
        // An access ACL sets the mode's group bits (its mask) and ACL_KILL_SGID clears
        // set-group-ID: the set-ID record is forgotten before and after, as for a chmod (see
        // `do_setattr`). No other attribute changes the mode (security.capability changes
        // what exec grants, not the set-ID bits), so other names keep the record.
        let changes_mode = name.as_bytes() == ACL_ACCESS_XATTR;
        if changes_mode {
            inode.forget_mode();
        }
        let result = self.set_xattr_on_host(&inode, &name, value, flags, setxattr_flags);
        if changes_mode {
            inode.forget_mode();
        }
        result
    }

    fn set_xattr_on_host(
        &self,
        inode: &Inode,
        name: &std::ffi::CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> SysResult<()> {
        let result = self.on_xattr_target(inode, |t| sys::setxattr(t, name, value, flags as i32));
        if name.to_bytes() == CAPS_XATTR {
            // After the host has it, whatever came of it: see `remember_no_caps`.
            inode.caps_changes.fetch_add(1, Ordering::SeqCst);
            inode.caps_absent_until.store(0, Ordering::SeqCst);
        }
        result?;
        // The kernel found the caller may not keep set-group-ID when setting an access ACL
        // (outside the group, without CAP_FSETID): the host, seeing us, kept it.
        if setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0 {
            let fd = self.path_fd(inode)?;
            let st = sys::fstat(&fd)?;
            if st.st_mode & libc::S_ISGID != 0 {
                sys::chmod(&fd, true, st.st_mode & 0o7777 & !libc::S_ISGID)?;
            }
        }
        Ok(())
    }

    pub(super) fn do_removexattr(&self, ino: u64, name: &OsStr) -> SysResult<()> {
        let inode = self.inode(ino)?;
        let name = xattr_name(name)?;
        self.on_xattr_target(&inode, |t| sys::removexattr(t, &name))
    }
}

/// The xattr holding file capabilities.
const CAPS_XATTR: &[u8] = b"security.capability";
/// The xattr holding a POSIX access ACL (whose mask is the mode's group bits).
const ACL_ACCESS_XATTR: &[u8] = b"system.posix_acl_access";

impl PassthroughFs {
    /// Remembers that the host held no security.capability for `inode` when `changes`
    /// (its `caps_changes`) was read, for as long as attributes may be cached (nothing when
    /// that is 0). A setxattr of it through us bumps `caps_changes` and then forgets; if it
    /// ran since `changes` was read, the memory is dropped again here (whichever of the two
    /// stores comes last, the result is "not known").
    pub(super) fn remember_no_caps(&self, inode: &Inode, changes: u64) {
        if self.opts.attr_timeout.is_zero() {
            return;
        }
        let until = self.now_ns() + self.opts.attr_timeout.as_nanos() as u64;
        inode.caps_absent_until.store(until, Ordering::SeqCst);
        if inode.caps_changes.load(Ordering::SeqCst) != changes {
            inode.caps_absent_until.store(0, Ordering::SeqCst);
        }
    }
}

fn xattr_name(name: &OsStr) -> SysResult<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(|_| libc::EINVAL)
}

/// The target's xattr names (NUL-terminated, as listxattr gives them) but trusted.*.
fn untrusted_names(target: &XattrTarget<'_>) -> SysResult<Vec<u8>> {
    // The list may grow between asking its size and reading it: ask again (bounded).
    for _ in 0..8 {
        let mut buf = vec![0; sys::listxattr(target, &mut [])?];
        match sys::listxattr(target, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf
                    .split_inclusive(|&b| b == 0)
                    .filter(|name| !name.starts_with(b"trusted."))
                    .flatten()
                    .copied()
                    .collect());
            }
            Err(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(libc::ERANGE)
}
