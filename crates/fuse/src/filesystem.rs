//! The one trait every lanefs file system implements: low-level (inode numbers, not paths),
//! `&self` methods called concurrently from every queue's worker, each answering through the
//! [`Reply`] it is given (now, or later from any thread).
//!
//! Every method has a default that answers ENOSYS (or the kernel's expected no-op), so a file
//! system implements what it supports and the kernel learns the rest once.

use std::ffi::OsStr;

use crate::abi;
use crate::reply::Reply;

/// The caller of a request.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub unique: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The caller's supplementary group the kernel sent (CREATE_SUPP_GROUP: on creates, the
    /// parent directory's group when the caller is in it other than as `gid`).
    pub supp_group: Option<u32>,
    /// The queue (worker) the request arrived on.
    pub queue: usize,
}

/// What a file system asks of the connection at INIT. The session intersects `want` with what
/// the kernel offers and reports the result in [`Connection`].
#[derive(Debug, Clone, Copy, Default)]
pub struct InitRequest {
    /// INIT flags (abi::init_flags) the file system implements beyond the engine's defaults.
    pub want: u64,
    /// With PASSTHROUGH: how many stacked file systems may lie below backing files (1 when
    /// they are plain local file systems; the kernel allows at most 2).
    pub max_stack_depth: u32,
}

/// What INIT settled: the protocol minor version and the flags both sides agreed on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Connection {
    pub minor: u32,
    pub flags: u64,
    pub max_write: u32,
    /// The /dev/fuse fd of the session, for ioctls such as FUSE_DEV_IOC_BACKING_OPEN.
    pub session_fd: i32,
    /// Requests wait for the queue of their caller's CPU, whose one worker serves them one
    /// after another (io_uring). Over /dev/fuse any idle worker takes any request, so this
    /// is false. Either way a handler that may block for long (truncating a large file, an
    /// open that waits for a lease break) should hand the work to `Reply::offload`, or the
    /// queue's other callers, stat and lseek included, wait behind it.
    pub per_cpu_queues: bool,
}

#[allow(unused_variables)]
pub trait Filesystem: Send + Sync + 'static {
    /// INIT: `offered` is what the kernel offers; return the flags this file system wants.
    fn init(&self, offered: u64) -> InitRequest {
        InitRequest::default()
    }

    /// INIT is complete: the negotiated connection, before any other request is served.
    fn connected(&self, conn: &Connection) {}

    /// The kernel is going away (DESTROY) or the session is ending.
    fn destroy(&self) {}

    /// Counters of the file system's own (fd cache hits, ...) for `lanefs stats`.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// INTERRUPT for the request `unique` (which may not have arrived yet, or may be
    /// answered already). No reply: an interrupted request answers EINTR through its own
    /// `Reply`. Only a file system that holds requests for long (blocking locks) cares.
    fn interrupt(&self, unique: u64) {}

    fn lookup(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    /// The kernel drops `nlookup` references to `ino`. No reply.
    fn forget(&self, ino: u64, nlookup: u64) {}

    fn batch_forget(&self, nodes: &[abi::ForgetOne]) {
        for node in nodes {
            self.forget(node.nodeid, node.nlookup);
        }
    }

    fn getattr(&self, req: &Request, ino: u64, fh: Option<u64>, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn setattr(&self, req: &Request, ino: u64, arg: &abi::SetattrIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn readlink(&self, req: &Request, ino: u64, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn symlink(&self, req: &Request, parent: u64, name: &OsStr, target: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn mknod(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MknodIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn mkdir(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MkdirIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn unlink(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn rmdir(&self, req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    /// rename and rename2; `flags` holds RENAME_NOREPLACE / RENAME_EXCHANGE / RENAME_WHITEOUT.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: Reply,
    ) {
        reply.error(libc::ENOSYS)
    }

    fn link(&self, req: &Request, ino: u64, newparent: u64, newname: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn open(&self, req: &Request, ino: u64, arg: &abi::OpenIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn read(&self, req: &Request, ino: u64, arg: &abi::ReadIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    /// `data` borrows the request buffer: copy it if the reply is deferred.
    fn write(&self, req: &Request, ino: u64, arg: &abi::WriteIn, data: &[u8], reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn flush(&self, req: &Request, ino: u64, arg: &abi::FlushIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn release(&self, req: &Request, ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        reply.ok()
    }

    fn fsync(&self, req: &Request, ino: u64, arg: &abi::FsyncIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn opendir(&self, req: &Request, ino: u64, arg: &abi::OpenIn, reply: Reply) {
        reply.open(&abi::OpenOut::default())
    }

    /// readdir (`plus` false) and readdirplus (`plus` true).
    fn readdir(&self, req: &Request, ino: u64, arg: &abi::ReadIn, plus: bool, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn releasedir(&self, req: &Request, ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        reply.ok()
    }

    fn fsyncdir(&self, req: &Request, ino: u64, arg: &abi::FsyncIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn statfs(&self, req: &Request, ino: u64, reply: Reply) {
        reply.statfs(&abi::Kstatfs {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Default::default()
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn setxattr(
        &self,
        req: &Request,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
        reply: Reply,
    ) {
        reply.error(libc::ENOSYS)
    }

    /// `size` 0 is a size probe: answer with [`Reply::xattr_size`].
    fn getxattr(&self, req: &Request, ino: u64, name: &OsStr, size: u32, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn listxattr(&self, req: &Request, ino: u64, size: u32, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn removexattr(&self, req: &Request, ino: u64, name: &OsStr, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn access(&self, req: &Request, ino: u64, mask: u32, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn create(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::CreateIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    /// O_TMPFILE: answer like create, with an entry that has no name.
    fn tmpfile(&self, req: &Request, parent: u64, arg: &abi::CreateIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn getlk(&self, req: &Request, ino: u64, arg: &abi::LkIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    /// setlk (`sleep` false) and setlkw (`sleep` true).
    fn setlk(&self, req: &Request, ino: u64, arg: &abi::LkIn, sleep: bool, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn fallocate(&self, req: &Request, ino: u64, arg: &abi::FallocateIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn lseek(&self, req: &Request, ino: u64, arg: &abi::LseekIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn copy_file_range(&self, req: &Request, ino: u64, arg: &abi::CopyFileRangeIn, reply: Reply) {
        reply.error(libc::ENOSYS)
    }

    fn syncfs(&self, req: &Request, ino: u64, reply: Reply) {
        reply.ok()
    }

    /// A restricted ioctl on an open file (`arg.fh`; a directory's when `arg.flags` has
    /// `ioctl_flags::DIR`): `data` is its input; answer with [`Reply::ioctl`]. The kernel
    /// forwards the file-attribute ioctls (FS_IOC_GETFLAGS/SETFLAGS, FS_IOC_FSGETXATTR/
    /// FSSETXATTR, which lsattr and chattr use) this way, after its own permission checks.
    fn ioctl(&self, req: &Request, ino: u64, arg: &abi::IoctlIn, data: &[u8], reply: Reply) {
        reply.error(libc::ENOTTY)
    }
}
