//! File attributes, the flags `lsattr` shows and `chattr` sets (immutable, append-only,
//! nodump, noatime, ...): the kernel forwards FS_IOC_GETFLAGS/SETFLAGS and
//! FS_IOC_FSGETXATTR/FSSETXATTR as FUSE_IOCTL on a file it opens read-only for the purpose
//! (fs/fuse/ioctl.c, `fuse_fileattr_get/set`), and we apply them to the host file.
//!
//! Rights: the kernel checks them for the caller before it asks (owner or CAP_FOWNER to set,
//! CAP_LINUX_IMMUTABLE to change immutable or append-only: `vfs_fileattr_set`), but the host
//! judges the daemon, which is root, so the same rules are checked here again for the
//! caller: a request that reaches us some other way must not get root's rights.
//!
//! Only the native numbers are served. The 32-bit FS_IOC32_GETFLAGS/SETFLAGS are translated
//! to the native ones by the kernel's compat ioctl entry for 32-bit callers, so the only way
//! they reach us is as a raw ioctl of a 64-bit caller, which the kernel forwards without any
//! check: they are answered ENOTTY, as a file system that does not know them would.
//!
//! Privilege is decided from what the request itself carries, its uid in the connection's
//! (initial) user namespace: root there is privileged, everyone else is not. A capability
//! read from /proc/PID/status would be relative to the caller's own user namespace (full in
//! any `unshare -Ur` shell) and could name another process once the pid is reused. A non-root
//! caller holding CAP_FOWNER or CAP_LINUX_IMMUTABLE is therefore refused here although the
//! kernel let it through: the safe side of a rule we cannot check exactly.

use lanefs_fuse::abi::{self, ioctl_flags};
use lanefs_fuse::{Reply, Request};

use super::PassthroughFs;
use super::sys::{
    self, FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FSXATTR_BYTES,
    SysResult,
};

/// FS_IMMUTABLE_FL | FS_APPEND_FL, and their FS_XFLAG_* twins.
const GUARD_FLAGS: u32 = 0x10 | 0x20;
const GUARD_XFLAGS: u32 = 0x8 | 0x10;

impl PassthroughFs {
    pub(super) fn do_ioctl(&self, req: &Request, arg: &abi::IoctlIn, data: &[u8], reply: Reply) {
        let fd = if arg.flags & ioctl_flags::DIR != 0 {
            // A directory's listing fd lives inside its stream: open our own.
            self.dirs
                .get(arg.fh)
                .ok_or(libc::EBADF)
                .and_then(|dir| {
                    self.open_inode(
                        &dir.inode,
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
                    )
                })
                .map(Held::Own)
        } else {
            self.files.get(arg.fh).ok_or(libc::EBADF).map(Held::Open)
        };
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let fd = fd.fd();
        let out_max = arg.out_size as usize;
        match arg.cmd {
            FS_IOC_GETFLAGS => match sys::get_flags(fd) {
                Ok(flags) => {
                    let bytes = flags.to_ne_bytes();
                    reply.ioctl(0, &bytes[..bytes.len().min(out_max)])
                }
                Err(e) => reply.error(e),
            },
            FS_IOC_FSGETXATTR => match sys::get_fsxattr(fd) {
                Ok(raw) => reply.ioctl(0, &raw[..FSXATTR_BYTES.min(out_max)]),
                Err(e) => reply.error(e),
            },
            FS_IOC_SETFLAGS => {
                let Some(new) = data.first_chunk::<4>().map(|b| u32::from_ne_bytes(*b)) else {
                    return reply.error(libc::EINVAL);
                };
                let result = sys::get_flags(fd)
                    .and_then(|old| self.may_set_attributes(req, fd, (old ^ new) & GUARD_FLAGS))
                    .and_then(|()| self.as_setter(req, || sys::set_flags(fd, new)));
                match result {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(e),
                }
            }
            FS_IOC_FSSETXATTR => {
                let Some(new) = data.first_chunk::<FSXATTR_BYTES>() else {
                    return reply.error(libc::EINVAL);
                };
                let xflags = |raw: &[u8; FSXATTR_BYTES]| {
                    u32::from_ne_bytes(*raw.first_chunk::<4>().expect("28 bytes"))
                };
                let result = sys::get_fsxattr(fd)
                    .and_then(|old| {
                        let changed = (xflags(&old) ^ xflags(new)) & GUARD_XFLAGS;
                        self.may_set_attributes(req, fd, changed)
                    })
                    .and_then(|()| self.as_setter(req, || sys::set_fsxattr(fd, new)));
                match result {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(e),
                }
            }
            _ => reply.error(libc::ENOTTY),
        }
    }

    /// Runs a SETFLAGS or FSSETXATTR as a caller other than root (its fsuid, no
    /// capabilities), so that the host file system applies its own rules for that caller on
    /// top of ours: ext4 wants CAP_SYS_RESOURCE for data journaling (`chattr +j`), which
    /// the daemon's root would otherwise lend to any owner.
    fn as_setter(&self, req: &Request, set: impl FnOnce() -> SysResult<()>) -> SysResult<()> {
        let _caller = match req.uid {
            0 => None,
            uid => Some(self.creds.as_caller(uid, req.gid, &[])?),
        };
        set()
    }

    /// The kernel's rules for changing file attributes, for the caller: the file's owner or
    /// root; changing immutable or append-only (`guard_change` non-zero) also needs root
    /// (CAP_FOWNER and CAP_LINUX_IMMUTABLE, which only root is taken to have: see the module
    /// comment).
    fn may_set_attributes(
        &self,
        req: &Request,
        fd: &std::os::fd::OwnedFd,
        guard_change: u32,
    ) -> SysResult<()> {
        let owner = sys::fstat(fd)?.st_uid;
        let privileged = req.uid == 0;
        if req.uid != owner && !privileged {
            return Err(libc::EPERM);
        }
        if guard_change != 0 && !privileged {
            return Err(libc::EPERM);
        }
        Ok(())
    }
}

/// The fd an ioctl acts on: the open file's, or one opened for a directory.
enum Held {
    Open(std::sync::Arc<super::handle::OpenFile>),
    Own(std::os::fd::OwnedFd),
}

impl Held {
    fn fd(&self) -> &std::os::fd::OwnedFd {
        match self {
            Held::Open(file) => &file.fd,
            Held::Own(fd) => fd,
        }
    }
}
