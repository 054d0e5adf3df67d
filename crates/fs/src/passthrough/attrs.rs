//! Attributes: getattr, setattr, readlink, statfs, access, and the xattr calls.
//! getattr never takes the write gate (seed 002).

use std::ffi::OsStr;

use lanefs_fuse::Reply;
use lanefs_fuse::abi::{self, fattr};

use super::PassthroughFs;
use super::counters::Counters;
use super::sys::{self, SysResult};

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
        let (inode, st) = match fh.and_then(|fh| self.files.get(fh)) {
            Some(file) => (file.inode.clone(), sys::fstat(&file.fd)?),
            None => {
                let inode = self.inode(ino)?;
                let st = sys::fstat(&*self.path_fd(&inode)?)?;
                (inode, st)
            }
        };
        if inode.is_regular() {
            inode.gate.set_size(st.st_size as u64);
        }
        Ok(self.attr_out(&st))
    }

    pub(super) fn do_setattr(&self, ino: u64, arg: &abi::SetattrIn) -> SysResult<abi::AttrOut> {
        let inode = self.inode(ino)?;
        let valid = arg.valid;
        let file = (valid & fattr::FH != 0)
            .then(|| self.files.get(arg.fh))
            .flatten();
        let path = self.path_fd(&inode)?;
        if valid & fattr::MODE != 0 {
            if inode.is_symlink() {
                return Err(libc::EOPNOTSUPP);
            }
            match &file {
                Some(file) => sys::chmod(&file.fd, false, arg.mode)?,
                None => sys::chmod(&path, true, arg.mode)?,
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
            sys::chown(&path, uid, gid)?;
        }
        if valid & fattr::SIZE != 0 {
            let kill = self.killpriv_v2() && valid & fattr::KILL_SUIDGID != 0;
            let _gate = inode.gate.exclusive();
            let _caps = self.creds.without_fsetid(kill)?;
            match file.as_ref().filter(|f| f.writable()) {
                Some(file) => sys::ftruncate(&file.fd, arg.size)?,
                None => {
                    let fd = self.open_inode(&inode, libc::O_WRONLY | libc::O_NOFOLLOW)?;
                    sys::ftruncate(&fd, arg.size)?
                }
            }
            inode.gate.set_size(arg.size);
            if kill {
                Counters::bump(&self.counters.kill_suidgid);
            }
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
        let st = match &file {
            Some(file) => sys::fstat(&file.fd)?,
            None => sys::fstat(&path)?,
        };
        Ok(self.attr_out(&st))
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

    // Xattrs go through /proc/self/fd/N, which follows our O_PATH fd to the inode. For a
    // symlink that would be its target, so symlinks answer as if they had no xattrs
    // (user.* xattrs are not allowed on symlinks anyway).

    pub(super) fn do_getxattr(&self, ino: u64, name: &OsStr, size: u32, reply: Reply) {
        let result = (|| {
            let inode = self.inode(ino)?;
            if inode.is_symlink() {
                return Err(libc::ENODATA);
            }
            let name = xattr_name(name)?;
            Ok((self.path_fd(&inode)?, name))
        })();
        let (fd, name) = match result {
            Ok(found) => found,
            Err(e) => return reply.error(e),
        };
        if size == 0 {
            match sys::getxattr(&fd, &name, &mut []) {
                Ok(n) => reply.xattr_size(n as u32),
                Err(e) => reply.error(e),
            }
        } else {
            reply.data_with(size as usize, |buf| sys::getxattr(&fd, &name, buf))
        }
    }

    pub(super) fn do_listxattr(&self, ino: u64, size: u32, reply: Reply) {
        let inode = match self.inode(ino) {
            Ok(inode) => inode,
            Err(e) => return reply.error(e),
        };
        if inode.is_symlink() {
            return if size == 0 {
                reply.xattr_size(0)
            } else {
                reply.data(&[])
            };
        }
        let fd = match self.path_fd(&inode) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        if size == 0 {
            match sys::listxattr(&fd, &mut []) {
                Ok(n) => reply.xattr_size(n as u32),
                Err(e) => reply.error(e),
            }
        } else {
            reply.data_with(size as usize, |buf| sys::listxattr(&fd, buf))
        }
    }

    pub(super) fn do_setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
    ) -> SysResult<()> {
        let inode = self.inode(ino)?;
        if inode.is_symlink() {
            return Err(libc::EPERM);
        }
        let name = xattr_name(name)?;
        sys::setxattr(&*self.path_fd(&inode)?, &name, value, flags as i32)
    }

    pub(super) fn do_removexattr(&self, ino: u64, name: &OsStr) -> SysResult<()> {
        let inode = self.inode(ino)?;
        if inode.is_symlink() {
            return Err(libc::EPERM);
        }
        let name = xattr_name(name)?;
        sys::removexattr(&*self.path_fd(&inode)?, &name)
    }
}

fn xattr_name(name: &OsStr) -> SysResult<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(|_| libc::EINVAL)
}
