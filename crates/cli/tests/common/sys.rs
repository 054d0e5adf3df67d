//! Thin syscall wrappers for the file-system tests: each returns `Result<_, Errno>` so a test
//! can record or assert the exact errno, and paths are `&Path`.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An errno value, printed by name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    pub fn name(self) -> String {
        let known = [
            (libc::EPERM, "EPERM"),
            (libc::ENOENT, "ENOENT"),
            (libc::EINTR, "EINTR"),
            (libc::EIO, "EIO"),
            (libc::ENXIO, "ENXIO"),
            (libc::EBADF, "EBADF"),
            (libc::EAGAIN, "EAGAIN"),
            (libc::EACCES, "EACCES"),
            (libc::EBUSY, "EBUSY"),
            (libc::EEXIST, "EEXIST"),
            (libc::EXDEV, "EXDEV"),
            (libc::ENODEV, "ENODEV"),
            (libc::ENOTDIR, "ENOTDIR"),
            (libc::EISDIR, "EISDIR"),
            (libc::EINVAL, "EINVAL"),
            (libc::EMFILE, "EMFILE"),
            (libc::ENFILE, "ENFILE"),
            (libc::EFBIG, "EFBIG"),
            (libc::ENOSPC, "ENOSPC"),
            (libc::ESPIPE, "ESPIPE"),
            (libc::EROFS, "EROFS"),
            (libc::EMLINK, "EMLINK"),
            (libc::ERANGE, "ERANGE"),
            (libc::ENAMETOOLONG, "ENAMETOOLONG"),
            (libc::ENOSYS, "ENOSYS"),
            (libc::ENOTEMPTY, "ENOTEMPTY"),
            (libc::ELOOP, "ELOOP"),
            (libc::ENODATA, "ENODATA"),
            (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (libc::ESTALE, "ESTALE"),
            (libc::ENOTCONN, "ENOTCONN"),
            (libc::E2BIG, "E2BIG"),
            (libc::ETXTBSY, "ETXTBSY"),
            (libc::EOVERFLOW, "EOVERFLOW"),
        ];
        known
            .iter()
            .find(|(n, _)| *n == self.0)
            .map_or_else(|| format!("errno {}", self.0), |(_, s)| s.to_string())
    }
}

impl std::fmt::Debug for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

pub type R<T> = Result<T, Errno>;

pub fn cstr(p: impl AsRef<OsStr>) -> CString {
    CString::new(p.as_ref().as_bytes()).expect("no NUL in path")
}

fn ok(ret: libc::c_int) -> R<()> {
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

fn ok_ssize(ret: isize) -> R<usize> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret as usize)
    }
}

// SAFETY (for every `unsafe` block below): the pointers passed are valid NUL-terminated
// strings or buffers of the given length that outlive the call; the calls have no other
// memory effects.

pub fn open(p: &Path, flags: i32, mode: u32) -> R<OwnedFd> {
    let c = cstr(p);
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(Errno::last());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn openat(dir: &impl AsRawFd, name: &str, flags: i32, mode: u32) -> R<OwnedFd> {
    let c = cstr(name);
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(Errno::last());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn stat(p: &Path) -> R<libc::stat> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::stat(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn lstat(p: &Path) -> R<libc::stat> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::lstat(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn fstat(fd: &impl AsRawFd) -> R<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }).map(|_| st)
}

pub fn mkdir(p: &Path, mode: u32) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::mkdir(c.as_ptr(), mode) })
}

pub fn rmdir(p: &Path) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::rmdir(c.as_ptr()) })
}

pub fn unlink(p: &Path) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::unlink(c.as_ptr()) })
}

pub fn rename(a: &Path, b: &Path) -> R<()> {
    let (a, b) = (cstr(a), cstr(b));
    ok(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

pub fn renameat2(a: &Path, b: &Path, flags: u32) -> R<()> {
    let (a, b) = (cstr(a), cstr(b));
    ok(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub fn link(a: &Path, b: &Path) -> R<()> {
    let (a, b) = (cstr(a), cstr(b));
    ok(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

/// linkat(2) with AT_SYMLINK_FOLLOW from `/proc/self/fd/N`: gives an O_TMPFILE a name.
pub fn link_fd(fd: &impl AsRawFd, b: &Path) -> R<()> {
    let a = cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let b = cstr(b);
    ok(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

pub fn symlink(target: &str, p: &Path) -> R<()> {
    let (t, c) = (cstr(target), cstr(p));
    ok(unsafe { libc::symlink(t.as_ptr(), c.as_ptr()) })
}

pub fn readlink(p: &Path) -> R<String> {
    let c = cstr(p);
    let mut buf = vec![0u8; 8192];
    let n = ok_ssize(unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::mknod(c.as_ptr(), mode, dev) })
}

pub fn chmod(p: &Path, mode: u32) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::chmod(c.as_ptr(), mode) })
}

pub fn fchmod(fd: &impl AsRawFd, mode: u32) -> R<()> {
    ok(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })
}

pub fn chown(p: &Path, uid: u32, gid: u32) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::chown(c.as_ptr(), uid, gid) })
}

pub fn lchown(p: &Path, uid: u32, gid: u32) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

pub fn truncate(p: &Path, len: i64) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::truncate(c.as_ptr(), len) })
}

pub fn ftruncate(fd: &impl AsRawFd, len: i64) -> R<()> {
    ok(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })
}

/// utimensat(2) on a path; `flags` may hold AT_SYMLINK_NOFOLLOW.
pub fn utimens(p: &Path, atime: libc::timespec, mtime: libc::timespec, flags: i32) -> R<()> {
    let c = cstr(p);
    let times = [atime, mtime];
    ok(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) })
}

pub fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

pub fn access(p: &Path, how: i32) -> R<()> {
    let c = cstr(p);
    ok(unsafe { libc::access(c.as_ptr(), how) })
}

pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> R<()> {
    let (c, n) = (cstr(p), cstr(name));
    ok(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

pub fn lsetxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> R<()> {
    let (c, n) = (cstr(p), cstr(name));
    ok(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

/// getxattr(2) with a buffer of `size` bytes (0: the size probe). Returns the length and the
/// bytes read.
pub fn getxattr(p: &Path, name: &str, size: usize) -> R<(usize, Vec<u8>)> {
    let (c, n) = (cstr(p), cstr(name));
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    let len = ok_ssize(unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), ptr, size) })?;
    buf.truncate(if size == 0 { 0 } else { len });
    Ok((len, buf))
}

pub fn lgetxattr(p: &Path, name: &str, size: usize) -> R<(usize, Vec<u8>)> {
    let (c, n) = (cstr(p), cstr(name));
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    let len = ok_ssize(unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), ptr, size) })?;
    buf.truncate(if size == 0 { 0 } else { len });
    Ok((len, buf))
}

/// listxattr(2) with a buffer of `size` bytes; returns the length and the sorted names.
pub fn listxattr(p: &Path, size: usize) -> R<(usize, Vec<String>)> {
    let c = cstr(p);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    let len = ok_ssize(unsafe { libc::listxattr(c.as_ptr(), ptr, size) })?;
    let mut names: Vec<String> = if size == 0 {
        Vec::new()
    } else {
        buf[..len]
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    names.sort();
    Ok((len, names))
}

pub fn llistxattr(p: &Path) -> R<Vec<String>> {
    let c = cstr(p);
    let mut buf = vec![0u8; 65536];
    let len =
        ok_ssize(unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    let mut names: Vec<String> = buf[..len]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

pub fn removexattr(p: &Path, name: &str) -> R<()> {
    let (c, n) = (cstr(p), cstr(name));
    ok(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

pub fn fallocate(fd: &impl AsRawFd, mode: i32, off: i64, len: i64) -> R<()> {
    ok(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off, len) })
}

pub fn lseek(fd: &impl AsRawFd, off: i64, whence: i32) -> R<i64> {
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

pub fn pread(fd: &impl AsRawFd, len: usize, off: i64) -> R<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = ok_ssize(unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len, off) })?;
    buf.truncate(n);
    Ok(buf)
}

pub fn pwrite(fd: &impl AsRawFd, data: &[u8], off: i64) -> R<usize> {
    ok_ssize(unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off) })
}

pub fn read(fd: &impl AsRawFd, len: usize) -> R<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = ok_ssize(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len) })?;
    buf.truncate(n);
    Ok(buf)
}

pub fn write(fd: &impl AsRawFd, data: &[u8]) -> R<usize> {
    ok_ssize(unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) })
}

pub fn fsync(fd: &impl AsRawFd) -> R<()> {
    ok(unsafe { libc::fsync(fd.as_raw_fd()) })
}

pub fn fdatasync(fd: &impl AsRawFd) -> R<()> {
    ok(unsafe { libc::fdatasync(fd.as_raw_fd()) })
}

pub fn statfs(p: &Path) -> R<libc::statfs> {
    let c = cstr(p);
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    ok(unsafe { libc::statfs(c.as_ptr(), &mut st) }).map(|_| st)
}

pub fn copy_file_range(
    from: &impl AsRawFd,
    from_off: i64,
    to: &impl AsRawFd,
    to_off: i64,
    len: usize,
) -> R<usize> {
    let (mut a, mut b) = (from_off, to_off);
    ok_ssize(unsafe {
        libc::copy_file_range(from.as_raw_fd(), &mut a, to.as_raw_fd(), &mut b, len, 0)
    })
}

/// fcntl F_SETFL: the descriptor's status flags (O_APPEND, O_NONBLOCK, ...).
pub fn setfl(fd: &impl AsRawFd, flags: i32) -> R<()> {
    ok(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })
}

pub fn flock(fd: &impl AsRawFd, op: i32) -> R<()> {
    ok(unsafe { libc::flock(fd.as_raw_fd(), op) })
}

fn flock_struct(kind: i32, start: i64, len: i64) -> libc::flock {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// F_SETLK (or F_SETLKW/F_OFD_SETLK as `cmd`) of `kind` (F_RDLCK/F_WRLCK/F_UNLCK).
pub fn setlk(fd: RawFd, cmd: i32, kind: i32, start: i64, len: i64) -> R<()> {
    let fl = flock_struct(kind, start, len);
    ok(unsafe { libc::fcntl(fd, cmd, &fl) })
}

/// F_GETLK: `None` if the range is free, else (type, pid, start, len) of a holder.
pub fn getlk(fd: RawFd, kind: i32, start: i64, len: i64) -> R<Option<(i32, i32, i64, i64)>> {
    let mut fl = flock_struct(kind, start, len);
    ok(unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) })?;
    if fl.l_type == libc::F_UNLCK as i16 {
        Ok(None)
    } else {
        Ok(Some((fl.l_type as i32, fl.l_pid, fl.l_start, fl.l_len)))
    }
}

/// Opens a directory stream; each `next` gives (name, d_type, telldir after it).
pub struct Dir(*mut libc::DIR);

impl Dir {
    pub fn open(p: &Path) -> R<Dir> {
        let c = cstr(p);
        let d = unsafe { libc::opendir(c.as_ptr()) };
        if d.is_null() {
            Err(Errno::last())
        } else {
            Ok(Dir(d))
        }
    }

    /// The next entry, or None at the end; errors are reported.
    pub fn next_entry(&mut self) -> R<Option<(String, u8)>> {
        // readdir signals errors only through errno.
        unsafe { *libc::__errno_location() = 0 };
        let e = unsafe { libc::readdir(self.0) };
        if e.is_null() {
            let err = Errno::last();
            return if err.0 == 0 { Ok(None) } else { Err(err) };
        }
        let e = unsafe { &*e };
        let name = unsafe { std::ffi::CStr::from_ptr(e.d_name.as_ptr()) };
        Ok(Some((name.to_string_lossy().into_owned(), e.d_type)))
    }

    pub fn tell(&mut self) -> i64 {
        unsafe { libc::telldir(self.0) }
    }

    pub fn seek(&mut self, pos: i64) {
        unsafe { libc::seekdir(self.0, pos) }
    }

    pub fn rewind(&mut self) {
        unsafe { libc::rewinddir(self.0) }
    }

    /// Every remaining entry except `.` and `..`.
    pub fn rest(&mut self) -> R<Vec<(String, u8)>> {
        let mut out = Vec::new();
        while let Some(e) = self.next_entry()? {
            if e.0 != "." && e.0 != ".." {
                out.push(e);
            }
        }
        Ok(out)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
}

pub fn file_type(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "chardev",
        libc::S_IFBLK => "blockdev",
        _ => "unknown",
    }
}

pub fn dtype_name(t: u8) -> &'static str {
    match t {
        libc::DT_REG => "file",
        libc::DT_DIR => "dir",
        libc::DT_LNK => "symlink",
        libc::DT_FIFO => "fifo",
        libc::DT_SOCK => "socket",
        libc::DT_CHR => "chardev",
        libc::DT_BLK => "blockdev",
        libc::DT_UNKNOWN => "unknown",
        _ => "other",
    }
}
