//! Operations on names: lookup, create, tmpfile, mkdir, mknod, symlink, link, unlink, rmdir,
//! rename. New inodes are made as the caller (per-thread fsuid/fsgid, see `creds`).

use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lanefs_fuse::Request;
use lanefs_fuse::abi;

use super::creds;
use super::inode::{Inode, InodeKey};
use super::sys::{self, SysResult, component};
use super::{Found, PassthroughFs, decode_dev};

impl PassthroughFs {
    /// Runs `create` (a call that makes an inode for `req`) as the caller: its fsuid/fsgid,
    /// and its umask (`umask` from the request), which the host then applies as natively:
    /// not where a default ACL rules instead (without DONT_MASK the kernel applied it
    /// already, and none is applied again).
    ///
    /// Groups: first only the one supplementary group the kernel vouches for (the parent's,
    /// when the caller is in it: CREATE_SUPP_GROUP), which decides everything about a
    /// create in a directory without an ACL (the group class of its mode, the new inode's
    /// group and set-group-ID bit). A POSIX ACL on the parent can grant through any of the
    /// caller's groups, though: when the host refuses (EACCES) a caller other than root,
    /// `create` runs once more with all of the caller's groups, read from
    /// /proc/PID/status (only if that process still has the caller's fsuid and fsgid, so a
    /// reused pid lends nobody its groups). So the common create costs nothing more, and a
    /// refused one one /proc read. The kernel has checked the caller's rights on the parent
    /// with its full groups before asking (default_permissions), so acting with more groups
    /// grants nothing the kernel did not.
    fn create_as_caller<T>(
        &self,
        req: &Request,
        umask: u32,
        mut create: impl FnMut() -> SysResult<T>,
    ) -> SysResult<T> {
        let dont_mask = self.negotiated().is_some_and(|n| n.dont_mask);
        sys::set_thread_umask(if dont_mask { umask & 0o777 } else { 0 })?;
        let first = {
            let _caller = self
                .creds
                .as_caller(req.uid, req.gid, req.supp_group.as_slice())?;
            create()
        };
        if !matches!(first, Err(libc::EACCES)) || req.uid == 0 || !self.creds.can_switch {
            return first;
        }
        let Some(groups) = creds::caller_groups(req.pid, req.uid, req.gid) else {
            return first;
        };
        let _caller = self.creds.as_caller(req.uid, req.gid, &groups)?;
        create()
    }

    pub(super) fn do_lookup(&self, parent: u64, name: &OsStr) -> SysResult<abi::EntryOut> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        self.lookup_child(&parent, &name)
    }

    pub(super) fn do_mkdir(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        arg: &abi::MkdirIn,
    ) -> SysResult<abi::EntryOut> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        let dir = self.path_fd(&parent)?;
        self.create_as_caller(req, arg.umask, || sys::mkdirat(&dir, &name, arg.mode))?;
        self.lookup_child(&parent, &name)
    }

    pub(super) fn do_mknod(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        arg: &abi::MknodIn,
    ) -> SysResult<abi::EntryOut> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        let dir = self.path_fd(&parent)?;
        self.create_as_caller(req, arg.umask, || {
            sys::mknodat(&dir, &name, arg.mode, decode_dev(arg.rdev))
        })?;
        self.lookup_child(&parent, &name)
    }

    pub(super) fn do_symlink(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> SysResult<abi::EntryOut> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        // The target is stored as given, never resolved by us.
        let target = std::ffi::CString::new(target.as_bytes()).map_err(|_| libc::EINVAL)?;
        let dir = self.path_fd(&parent)?;
        // Symlinks have no mode to mask.
        self.create_as_caller(req, 0, || sys::symlinkat(&target, &dir, &name))?;
        self.lookup_child(&parent, &name)
    }

    pub(super) fn do_link(
        &self,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> SysResult<abi::EntryOut> {
        let inode = self.inode(ino)?;
        let parent = self.inode(newparent)?;
        let name = component(newname)?;
        let fd = self.path_fd(&inode)?;
        let dir = self.path_fd(&parent)?;
        sys::linkat(&fd, &dir, &name)?;
        self.lookup_child(&parent, &name)
    }

    pub(super) fn do_remove(&self, parent: u64, name: &OsStr, flags: i32) -> SysResult<()> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        let dir = self.path_fd(&parent)?;
        sys::unlinkat(&dir, &name, flags)
    }

    pub(super) fn do_rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> SysResult<()> {
        let parent = self.inode(parent)?;
        let newparent = self.inode(newparent)?;
        let name = component(name)?;
        let newname = component(newname)?;
        let dir = self.path_fd(&parent)?;
        let newdir = self.path_fd(&newparent)?;
        sys::renameat2(&dir, &name, &newdir, &newname, flags)?;
        // A symlink that moved is reached under its new name for xattrs.
        self.note_symlink_name(&newparent, &newdir, &newname);
        if flags & libc::RENAME_EXCHANGE != 0 {
            self.note_symlink_name(&parent, &dir, &name);
        }
        Ok(())
    }

    fn note_symlink_name(&self, parent: &Arc<Inode>, dir: &OwnedFd, name: &CStr) {
        if let Ok(st) = sys::fstatat(dir, name, 0)
            && st.st_mode & libc::S_IFMT == libc::S_IFLNK
            && let Some(inode) = self.inodes.find(&InodeKey {
                dev: st.st_dev,
                ino: st.st_ino,
            })
        {
            inode.set_link_name(parent.clone(), name.to_owned());
        }
    }

    pub(super) fn do_create(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        arg: &abi::CreateIn,
    ) -> SysResult<(abi::EntryOut, abi::OpenOut)> {
        let parent = self.inode(parent)?;
        let name = component(name)?;
        let dir = self.path_fd(&parent)?;
        // Always exclusive on the host: the kernel sends CREATE only for a name it believes
        // absent, and marks the file it gets back as created, so it checks no permission and
        // skips O_TRUNC. A name the host has meanwhile (made on the host, or a cached
        // negative entry) must not be opened here with the daemon's rights.
        let flags = super::files::host_open_flags(arg.flags as i32) | libc::O_CREAT | libc::O_EXCL;
        let created =
            self.create_as_caller(req, arg.umask, || sys::openat(&dir, &name, flags, arg.mode));
        let fd = match created {
            Ok(fd) => fd,
            // The name exists and the caller did not ask for O_EXCL. ESTALE makes the kernel
            // walk the path again with LOOKUP_REVAL (do_filp_open): its lookup finds the
            // object, and it opens it as any existing one, with the caller's permission
            // checks, fs.protected_regular, O_TRUNC, and its own handling of FIFOs, devices,
            // directories and symlinks (an OPEN request to us only for a regular file).
            Err(libc::EEXIST) if arg.flags as i32 & libc::O_EXCL == 0 => {
                return Err(libc::ESTALE);
            }
            Err(e) => return Err(e),
        };
        // Without its stat nothing could tell the name still leads to our file, so a failing
        // fstat (ENOMEM) leaves it; everything after it removes the file on failure.
        let st = sys::fstat(&fd)?;
        self.created(req, &parent, fd, &st, arg.flags as i32, false)
            .inspect_err(|_| remove_if_same(&dir, &name, &st))
    }

    /// O_TMPFILE: an unnamed file in `parent`. It has no name to reopen by handle until it
    /// is linked, so its inode keeps an O_PATH fd.
    pub(super) fn do_tmpfile(
        &self,
        req: &Request,
        parent: u64,
        arg: &abi::CreateIn,
    ) -> SysResult<(abi::EntryOut, abi::OpenOut)> {
        let parent = self.inode(parent)?;
        let dir = self.path_fd(&parent)?;
        let flags = super::files::host_open_flags(arg.flags as i32) | libc::O_TMPFILE;
        // O_NOFOLLOW is harmless on ".", which names `dir` itself.
        let fd = self.create_as_caller(req, arg.umask, || {
            sys::openat(&dir, c".", flags & !libc::O_CREAT, arg.mode)
        })?;
        // Unnamed: it goes with its fd if anything below fails.
        let st = sys::fstat(&fd)?;
        self.created(req, &parent, fd, &st, arg.flags as i32, true)
    }

    /// Registers a file just created through `fd` (with stat `st`) and opens it for the
    /// client.
    fn created(
        &self,
        req: &Request,
        parent: &Inode,
        fd: OwnedFd,
        st: &libc::stat,
        flags: i32,
        keep_fd: bool,
    ) -> SysResult<(abi::EntryOut, abi::OpenOut)> {
        let inode = self.register(parent, Found::Open(&fd), keep_fd, st)?;
        // The kernel's first write to the new file asks for its security.capability
        // (file_remove_privs: a new FUSE inode is never S_NOSEC), a round trip no flag of
        // 6.18 removes. The host file was made just now, exclusively, and a capability is
        // never inherited, so the answer is known: "none", remembered as any host answer
        // is (`remember_no_caps`), which spares that GETXATTR its host syscall.
        let changes = inode.caps_changes.load(Ordering::SeqCst);
        self.remember_no_caps(&inode, changes);
        let entry = self.entry_out(&inode, st);
        match self.finish_open(req, &inode, fd, flags, Some(st.st_mode)) {
            Ok(open) => Ok((entry, open)),
            Err(e) => {
                self.unregister(inode.nodeid);
                Err(e)
            }
        }
    }
}

/// Undoes a create whose answer failed after the host file was made (the kernel is told the
/// create failed, so nobody would know of the file): unlinks `name` in `dir` if it is still
/// the object we created (same device and inode), never what the host may have put there
/// since. What could replace it between the check and the unlink is another file of that
/// directory made in that instant by the host, which the unlink would then remove: a window
/// of one syscall, on a name the caller had just asked to create.
fn remove_if_same(dir: &OwnedFd, name: &CStr, created: &libc::stat) {
    let same = sys::fstatat(dir, name, libc::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| (st.st_dev, st.st_ino) == (created.st_dev, created.st_ino));
    if same && let Err(e) = sys::unlinkat(dir, name, 0) {
        tracing::warn!(errno = e, "removing a file whose create failed");
    }
}
