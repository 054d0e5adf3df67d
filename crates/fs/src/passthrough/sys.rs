//! Thin, safe wrappers over the syscalls the passthrough file system makes. Every `unsafe`
//! block of the passthrough lives here, each with its SAFETY comment; callers see
//! `Result<_, Errno>` where the errno is the host's, unchanged (it goes to the kernel as is).
//!
//! Architecture invariant: every name handed to the host is one path component checked by
//! [`component`] and resolved relative to a directory fd with symlinks never followed
//! (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`); nothing here resolves a multi-component path except
//! `/proc/self/fd/N`, which names one of our own fds. Every open here adds O_NOCTTY: the
//! daemon is a session leader, and a tty reachable in SOURCE must never become its controlling
//! terminal.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// A host errno, positive (libc::ENOENT).
pub type Errno = i32;
pub type SysResult<T> = Result<T, Errno>;

fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn check(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 { Err(errno()) } else { Ok(ret) }
}

fn check_size(ret: libc::ssize_t) -> SysResult<usize> {
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

fn owned(fd: libc::c_int) -> SysResult<OwnedFd> {
    let fd = check(fd)?;
    // SAFETY: the syscall just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const EMPTY: &CStr = c"";

/// Checks that `name` is one path component the client may use: not empty, not `.` or `..`,
/// no `/` and no NUL. The kernel never sends others; this keeps a buggy or hostile request
/// from walking out of the exported directory.
pub fn component(name: &OsStr) -> SysResult<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(libc::EINVAL);
    }
    CString::new(bytes).map_err(|_| libc::EINVAL)
}

/// `/proc/self/fd/N`: reaches the object an fd (O_PATH included) refers to, for the calls
/// that take no fd (chmod and xattrs on O_PATH fds, reopening an O_PATH fd).
pub fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

/// The host's file handle of an inode (name_to_handle_at), enough to reopen it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandle {
    handle_type: i32,
    bytes: Box<[u8]>,
}

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct HandleBuf {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; libc::MAX_HANDLE_SZ as usize],
}

/// The file handle and mount id of what `fd` refers to.
pub fn handle_of(fd: &OwnedFd) -> SysResult<(FileHandle, i32)> {
    let mut buf = HandleBuf {
        handle_bytes: libc::MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; libc::MAX_HANDLE_SZ as usize],
    };
    let mut mount_id = 0;
    // SAFETY: buf is a file_handle with handle_bytes set to the room after it; the empty path
    // with AT_EMPTY_PATH names `fd` itself; mount_id is a valid out pointer.
    check(unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            (&raw mut buf).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    })?;
    let len = (buf.handle_bytes as usize).min(buf.f_handle.len());
    Ok((
        FileHandle {
            handle_type: buf.handle_type,
            bytes: buf.f_handle[..len].into(),
        },
        mount_id,
    ))
}

/// Opens the inode a handle names (needs CAP_DAC_READ_SEARCH). ESTALE when it is gone.
pub fn open_by_handle(mount: &OwnedFd, handle: &FileHandle, flags: i32) -> SysResult<OwnedFd> {
    let mut buf = HandleBuf {
        handle_bytes: handle.bytes.len() as u32,
        handle_type: handle.handle_type,
        f_handle: [0; libc::MAX_HANDLE_SZ as usize],
    };
    buf.f_handle[..handle.bytes.len()].copy_from_slice(&handle.bytes);
    // SAFETY: buf is a valid file_handle; the kernel only reads it.
    owned(unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut buf).cast::<libc::file_handle>(),
            flags | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    })
}

/// openat relative to `dir`, never following a symlink in the last component.
pub fn openat(dir: &OwnedFd, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: name is NUL-terminated; dir is open.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY,
            mode as libc::c_uint,
        )
    })
}

/// Opens the exported directory (O_PATH), following symlinks in the path the user gave.
pub fn open_source(path: &CStr) -> SysResult<OwnedFd> {
    // SAFETY: path is NUL-terminated.
    owned(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

/// A private copy of the mount tree at the directory `root` (an fd of it: the exported
/// directory and every mount below it), attached nowhere: open_tree(OPEN_TREE_CLONE |
/// AT_RECURSIVE | AT_EMPTY_PATH), as overlayfs does for its layers. Cloned from the fd, not
/// by path, so a path swapped meanwhile cannot make it copy another tree. Its mount flags
/// are ours to set (`set_tree_atime`) without touching the host's mounts. Needs
/// CAP_SYS_ADMIN. Returns an O_PATH fd of its root.
pub fn clone_tree(root: &OwnedFd) -> SysResult<OwnedFd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as u32
        | libc::AT_EMPTY_PATH as u32;
    // SAFETY: the path is the empty string; open_tree returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, root.as_raw_fd(), EMPTY.as_ptr(), flags) };
    owned(fd as libc::c_int)
}

/// Sets the atime rule (`MOUNT_ATTR_RELATIME`, `_NOATIME` or `_STRICTATIME`, with
/// `_NODIRATIME` or not) of every mount of a tree made by `clone_tree`.
pub fn set_tree_atime(tree: &OwnedFd, atime: u64) -> SysResult<()> {
    let attr = libc::mount_attr {
        attr_set: atime,
        attr_clr: libc::MOUNT_ATTR__ATIME | libc::MOUNT_ATTR_NODIRATIME,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: attr is a valid mount_attr of the size passed; the path is the empty string.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            EMPTY.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            size_of::<libc::mount_attr>(),
        ) as libc::c_int
    })
    .map(drop)
}

/// Reopens what an fd (O_PATH included) refers to with new flags, through /proc/self/fd.
pub fn reopen(fd: &OwnedFd, flags: i32) -> SysResult<OwnedFd> {
    let path = proc_path(fd.as_raw_fd());
    // The magic link must be followed; it leads to our own fd's object, nowhere else.
    let flags = (flags & !libc::O_NOFOLLOW) | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: path is NUL-terminated.
    owned(unsafe { libc::open(path.as_ptr(), flags) })
}

pub fn fstat(fd: &OwnedFd) -> SysResult<libc::stat> {
    fstatat(fd, EMPTY, libc::AT_EMPTY_PATH)
}

pub fn fstatat(dir: &OwnedFd, name: &CStr, flags: i32) -> SysResult<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is a valid out pointer; name is NUL-terminated.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            flags | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded, so it filled st.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatfs(fd: &OwnedFd) -> SysResult<libc::statfs> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: st is a valid out pointer.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded, so it filled st.
    Ok(unsafe { st.assume_init() })
}

pub fn mkdirat(dir: &OwnedFd, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: name is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dir: &OwnedFd, name: &CStr, mode: u32, dev: libc::dev_t) -> SysResult<()> {
    // SAFETY: name is NUL-terminated.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

pub fn symlinkat(target: &CStr, dir: &OwnedFd, name: &CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// A new name for what `fd` (O_PATH included) refers to. AT_EMPTY_PATH needs
/// CAP_DAC_READ_SEARCH; without it the kernel says ENOENT and /proc/self/fd does the job.
pub fn linkat(fd: &OwnedFd, dir: &OwnedFd, name: &CStr) -> SysResult<()> {
    // SAFETY: the strings are NUL-terminated; the fds are open.
    let direct = check(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    });
    match direct {
        Err(libc::ENOENT) => {
            let path = proc_path(fd.as_raw_fd());
            // SAFETY: as above.
            check(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })
            .map(drop)
        }
        other => other.map(drop),
    }
}

pub fn unlinkat(dir: &OwnedFd, name: &CStr, flags: i32) -> SysResult<()> {
    // SAFETY: name is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    dir: &OwnedFd,
    name: &CStr,
    newdir: &OwnedFd,
    newname: &CStr,
    flags: u32,
) -> SysResult<()> {
    // SAFETY: the names are NUL-terminated; the fds are open.
    check(unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            name.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// The target of the symlink `fd` (an O_PATH fd of it) refers to.
pub fn readlink(fd: &OwnedFd) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buf has buf.len() writable bytes.
    let n = check_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// chmod of what an fd refers to; O_PATH fds go through /proc/self/fd (fchmod refuses them).
pub fn chmod(fd: &OwnedFd, is_path_fd: bool, mode: u32) -> SysResult<()> {
    if is_path_fd {
        let path = proc_path(fd.as_raw_fd());
        // SAFETY: path is NUL-terminated.
        check(unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), mode, 0) }).map(drop)
    } else {
        // SAFETY: fd is open.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
    }
}

/// chown of what an fd refers to (a symlink itself, not its target); u32::MAX leaves one out.
pub fn chown(fd: &OwnedFd, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: the empty path with AT_EMPTY_PATH names fd itself.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// utimensat on what an fd refers to (UTIME_NOW and UTIME_OMIT in tv_nsec as usual).
pub fn utimens(fd: &OwnedFd, times: &[libc::timespec; 2]) -> SysResult<()> {
    // SAFETY: times points to two timespecs; the empty path with AT_EMPTY_PATH names fd.
    check(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn ftruncate(fd: &OwnedFd, size: u64) -> SysResult<()> {
    // SAFETY: fd is open.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) }).map(drop)
}

/// faccessat2 with AT_EMPTY_PATH: may the daemon's credentials access what fd refers to.
pub fn access(fd: &OwnedFd, mask: u32) -> SysResult<()> {
    // SAFETY: the empty path with AT_EMPTY_PATH names fd; the syscall takes plain integers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            mask as libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    };
    if ret < 0 { Err(errno()) } else { Ok(()) }
}

pub fn pread(fd: &OwnedFd, buf: &mut [u8], offset: u64) -> SysResult<usize> {
    // SAFETY: buf has buf.len() writable bytes.
    check_size(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as libc::off_t,
        )
    })
}

pub fn pwrite(fd: &OwnedFd, data: &[u8], offset: u64) -> SysResult<usize> {
    // SAFETY: data has data.len() readable bytes.
    check_size(unsafe {
        libc::pwrite(
            fd.as_raw_fd(),
            data.as_ptr().cast(),
            data.len(),
            offset as libc::off_t,
        )
    })
}

/// pwrite with RWF_* flags (pwritev2): RWF_DSYNC / RWF_SYNC make the write durable before
/// it returns, as O_DSYNC / O_SYNC would.
pub fn pwrite_flags(fd: &OwnedFd, data: &[u8], offset: u64, rwf: i32) -> SysResult<usize> {
    let iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: iov points at data.len() readable bytes; the kernel only reads them.
    check_size(unsafe { libc::pwritev2(fd.as_raw_fd(), &iov, 1, offset as libc::off_t, rwf) })
}

pub fn fsync(fd: &OwnedFd, datasync: bool) -> SysResult<()> {
    // SAFETY: fd is open.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

pub fn fallocate(fd: &OwnedFd, mode: i32, offset: u64, len: u64) -> SysResult<()> {
    // SAFETY: fd is open.
    check(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
    .map(drop)
}

/// Turns O_NONBLOCK off on an open file.
pub fn clear_nonblocking(fd: &OwnedFd) -> SysResult<()> {
    // SAFETY: F_GETFL/F_SETFL on an open fd.
    unsafe {
        let flags = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            flags & !libc::O_NONBLOCK,
        ))
        .map(drop)
    }
}

pub fn lseek(fd: &OwnedFd, offset: u64, whence: i32) -> SysResult<u64> {
    // SAFETY: fd is open.
    let ret = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, whence) };
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as u64)
    }
}

pub fn copy_file_range(
    fd_in: &OwnedFd,
    off_in: u64,
    fd_out: &OwnedFd,
    off_out: u64,
    len: u64,
    flags: u32,
) -> SysResult<usize> {
    let mut off_in = off_in as libc::loff_t;
    let mut off_out = off_out as libc::loff_t;
    // SAFETY: the offsets are valid in/out pointers; the fds are open.
    check_size(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len as usize,
            flags,
        )
    })
}

/// Reads raw `linux_dirent64` records into `buf`; 0 at the end of the directory.
pub fn getdents(fd: &OwnedFd, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: buf has buf.len() writable bytes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

pub fn flock(fd: &OwnedFd, operation: i32) -> SysResult<()> {
    // SAFETY: fd is open.
    check(unsafe { libc::flock(fd.as_raw_fd(), operation) }).map(drop)
}

/// fcntl with a `struct flock` (the OFD lock commands).
pub fn fcntl_lock(fd: &OwnedFd, cmd: i32, lock: &mut libc::flock) -> SysResult<()> {
    // SAFETY: lock is a valid flock the kernel may read and write.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, lock as *mut libc::flock) }).map(drop)
}

/// What an xattr call acts on. The f*xattr calls refuse O_PATH fds, so both go through
/// /proc/self/fd: an object by its own fd (the magic link followed to it), or a symlink by
/// its parent's fd and its name (not followed: the l*xattr calls).
pub enum XattrTarget<'a> {
    Object(&'a OwnedFd),
    Symlink(&'a OwnedFd, &'a CStr),
}

impl XattrTarget<'_> {
    fn path(&self) -> CString {
        match self {
            XattrTarget::Object(fd) => proc_path(fd.as_raw_fd()),
            XattrTarget::Symlink(dir, name) => {
                let mut path = proc_path(dir.as_raw_fd()).into_bytes();
                path.push(b'/');
                path.extend_from_slice(name.to_bytes());
                CString::new(path).expect("no NUL in a component")
            }
        }
    }
}

/// `buf` empty is a size probe.
pub fn getxattr(target: &XattrTarget<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    let path = target.path();
    let value = buf.as_mut_ptr().cast();
    // SAFETY: the strings are NUL-terminated; buf has buf.len() writable bytes.
    check_size(unsafe {
        match target {
            XattrTarget::Object(_) => {
                libc::getxattr(path.as_ptr(), name.as_ptr(), value, buf.len())
            }
            XattrTarget::Symlink(..) => {
                libc::lgetxattr(path.as_ptr(), name.as_ptr(), value, buf.len())
            }
        }
    })
}

pub fn listxattr(target: &XattrTarget<'_>, buf: &mut [u8]) -> SysResult<usize> {
    let path = target.path();
    let list = buf.as_mut_ptr().cast();
    // SAFETY: path is NUL-terminated; buf has buf.len() writable bytes.
    check_size(unsafe {
        match target {
            XattrTarget::Object(_) => libc::listxattr(path.as_ptr(), list, buf.len()),
            XattrTarget::Symlink(..) => libc::llistxattr(path.as_ptr(), list, buf.len()),
        }
    })
}

pub fn setxattr(target: &XattrTarget<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
    let path = target.path();
    let data = value.as_ptr().cast();
    // SAFETY: the strings are NUL-terminated; value has value.len() readable bytes.
    check(unsafe {
        match target {
            XattrTarget::Object(_) => {
                libc::setxattr(path.as_ptr(), name.as_ptr(), data, value.len(), flags)
            }
            XattrTarget::Symlink(..) => {
                libc::lsetxattr(path.as_ptr(), name.as_ptr(), data, value.len(), flags)
            }
        }
    })
    .map(drop)
}

pub fn removexattr(target: &XattrTarget<'_>, name: &CStr) -> SysResult<()> {
    let path = target.path();
    // SAFETY: the strings are NUL-terminated.
    check(unsafe {
        match target {
            XattrTarget::Object(_) => libc::removexattr(path.as_ptr(), name.as_ptr()),
            XattrTarget::Symlink(..) => libc::lremovexattr(path.as_ptr(), name.as_ptr()),
        }
    })
    .map(drop)
}

pub use lanefs_fuse::fileattr::{
    FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FSXATTR_BYTES,
};

/// FS_IOC_GETFLAGS (the kernel's and chattr's int, whatever the ioctl's encoded size).
pub fn get_flags(fd: &OwnedFd) -> SysResult<u32> {
    let mut flags: libc::c_int = 0;
    // SAFETY: the ioctl writes one int to the pointer, which is valid.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut flags) })?;
    Ok(flags as u32)
}

/// FS_IOC_SETFLAGS.
pub fn set_flags(fd: &OwnedFd, flags: u32) -> SysResult<()> {
    let flags = flags as libc::c_int;
    // SAFETY: the ioctl reads one int from the pointer, which is valid.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_SETFLAGS as _, &flags) }).map(drop)
}

/// FS_IOC_FSGETXATTR: the bytes of struct fsxattr.
pub fn get_fsxattr(fd: &OwnedFd) -> SysResult<[u8; FSXATTR_BYTES]> {
    let mut raw = [0u8; FSXATTR_BYTES];
    // SAFETY: the ioctl writes a struct fsxattr to the buffer, which has room.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR as _, raw.as_mut_ptr()) })?;
    Ok(raw)
}

/// FS_IOC_FSSETXATTR.
pub fn set_fsxattr(fd: &OwnedFd, raw: &[u8; FSXATTR_BYTES]) -> SysResult<()> {
    // SAFETY: the ioctl reads a struct fsxattr from the buffer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR as _, raw.as_ptr()) }).map(drop)
}

/// FUSE_DEV_IOC_BACKING_OPEN: registers `fd` as a backing file; returns its backing id.
pub fn backing_open(session_fd: RawFd, fd: &OwnedFd) -> SysResult<i32> {
    let map = lanefs_fuse::abi::BackingMap {
        fd: fd.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads one fuse_backing_map from the pointer.
    check(unsafe {
        libc::ioctl(
            session_fd,
            lanefs_fuse::abi::FUSE_DEV_IOC_BACKING_OPEN as _,
            &map as *const lanefs_fuse::abi::BackingMap,
        )
    })
}

/// FUSE_DEV_IOC_BACKING_CLOSE.
pub fn backing_close(session_fd: RawFd, backing_id: i32) -> SysResult<()> {
    // SAFETY: the ioctl reads one u32 from the pointer.
    check(unsafe {
        libc::ioctl(
            session_fd,
            lanefs_fuse::abi::FUSE_DEV_IOC_BACKING_CLOSE as _,
            &backing_id as *const i32,
        )
    })
    .map(drop)
}

thread_local! {
    /// Whether this thread has its own umask (see [`set_thread_umask`]).
    static OWN_UMASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets the calling thread's umask. unshare(CLONE_FS) first (once per thread) makes the
/// umask (and cwd) this thread's own, so the rest of the process keeps its umask (the
/// control socket's mode depends on it).
pub fn set_thread_umask(mask: u32) -> SysResult<()> {
    if !OWN_UMASK.get() {
        // SAFETY: unshare takes a plain flag and changes only this thread's fs state.
        check(unsafe { libc::unshare(libc::CLONE_FS) })?;
        OWN_UMASK.set(true);
    }
    // SAFETY: umask takes a plain integer; after the unshare it is this thread's alone.
    unsafe { libc::umask(mask) };
    Ok(())
}

/// Raises the soft open-file limit to the hard one (daemons are often started with a soft
/// 1024); returns the soft limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: limit is a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } < 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: raised is a valid rlimit; raising the soft limit up to the hard one needs
        // no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    limit.rlim_cur
}

pub fn geteuid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::getegid() }
}

/// Capability sets as capget(2) v3 sees them (two 32-bit words each).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_FSETID: u32 = 4;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// The calling thread's capability sets (v3: two 32-bit words each).
fn capget() -> SysResult<(CapHeader, [CapData; 2])> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and data are the v3 layout capget expects.
    let ret = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if ret < 0 {
        return Err(errno());
    }
    Ok((header, data))
}

/// The effective capabilities of the calling thread (64 bits).
pub fn effective_caps() -> SysResult<u64> {
    let (_, data) = capget()?;
    Ok(data[0].effective as u64 | (data[1].effective as u64) << 32)
}

/// Sets the calling thread's effective capabilities (a raw syscall: this thread only).
pub fn set_effective_caps(effective: u64) -> SysResult<()> {
    let (mut header, mut data) = capget()?;
    data[0].effective = effective as u32;
    data[1].effective = (effective >> 32) as u32;
    // SAFETY: header and data are the v3 layout capset expects; capset only reads.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if ret < 0 { Err(errno()) } else { Ok(()) }
}

/// The capability bit that lets a writer keep set-user-id bits.
pub const CAP_FSETID_BIT: u64 = 1 << CAP_FSETID;
/// The capability bits that let the daemon take on a caller's fsuid, fsgid and groups.
pub const CAP_SETGID_BIT: u64 = 1 << CAP_SETGID;
pub const CAP_SETUID_BIT: u64 = 1 << CAP_SETUID;

/// setfsuid/setfsgid of the calling thread only (the kernel's credentials are per thread and
/// glibc does not broadcast these two). Returns the previous value.
pub fn set_fsuid(uid: u32) -> u32 {
    // SAFETY: no memory effects.
    unsafe { libc::setfsuid(uid) as u32 }
}

pub fn set_fsgid(gid: u32) -> u32 {
    // SAFETY: no memory effects.
    unsafe { libc::setfsgid(gid) as u32 }
}

/// The calling thread's fsuid: setfsuid(-1) changes nothing and returns it. (setfsuid reports
/// the previous id whether or not it changed it, so a switch is checked by asking again.)
pub fn fsuid_now() -> u32 {
    set_fsuid(u32::MAX)
}

/// The calling thread's fsgid (see [`fsuid_now`]).
pub fn fsgid_now() -> u32 {
    set_fsgid(u32::MAX)
}

/// Sets the calling thread's supplementary groups: the raw syscall, which changes this thread
/// only (glibc's setgroups changes every thread of the process). Needs CAP_SETGID.
pub fn set_thread_groups(groups: &[u32]) -> SysResult<()> {
    // SAFETY: groups points to groups.len() gid_t values, which the kernel only reads.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret < 0 { Err(errno()) } else { Ok(()) }
}

/// The calling thread's supplementary groups.
pub fn groups() -> SysResult<Vec<u32>> {
    // SAFETY: a zero size only asks for the count.
    let count = check(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
    let mut groups = vec![0; count as usize];
    // SAFETY: groups has room for `count` gid_t values.
    let got = check(unsafe { libc::getgroups(count, groups.as_mut_ptr()) })?;
    groups.truncate(got as usize);
    Ok(groups)
}

pub fn syncfs(fd: &OwnedFd) -> SysResult<()> {
    // SAFETY: fd is open.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}
