//! The kernel's FUSE ABI, protocol 7.45, as fixed-layout structs.
//!
//! Written from the layout documented in the kernel's `include/uapi/linux/fuse.h` of Linux 6.18
//! (Debian 12's header stops at 7.38 and lacks the io_uring structs). Every struct is
//! `#[repr(C)]`, derives zerocopy's traits so it can be read from and written to a byte buffer
//! without `unsafe`, and has a compile-time size check against the kernel's size.
//!
//! Architecture invariant: this module does no I/O and holds no state.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor version we speak: 7.31 brought the layouts we rely on (init_out with
/// max_pages, setattr with ctime and kill_suidgid).
pub const MIN_KERNEL_MINOR_VERSION: u32 = 31;
pub const ROOT_ID: u64 = 1;

/// Opcodes (enum fuse_opcode).
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
    pub const COPY_FILE_RANGE_64: u32 = 53;

    /// One past the largest opcode: the size of per-opcode tables.
    pub const COUNT: usize = 54;

    /// The name an opcode is shown under in `lanefs stats` and logs.
    pub fn name(op: u32) -> &'static str {
        match op {
            LOOKUP => "lookup",
            FORGET => "forget",
            GETATTR => "getattr",
            SETATTR => "setattr",
            READLINK => "readlink",
            SYMLINK => "symlink",
            MKNOD => "mknod",
            MKDIR => "mkdir",
            UNLINK => "unlink",
            RMDIR => "rmdir",
            RENAME => "rename",
            LINK => "link",
            OPEN => "open",
            READ => "read",
            WRITE => "write",
            STATFS => "statfs",
            RELEASE => "release",
            FSYNC => "fsync",
            SETXATTR => "setxattr",
            GETXATTR => "getxattr",
            LISTXATTR => "listxattr",
            REMOVEXATTR => "removexattr",
            FLUSH => "flush",
            INIT => "init",
            OPENDIR => "opendir",
            READDIR => "readdir",
            RELEASEDIR => "releasedir",
            FSYNCDIR => "fsyncdir",
            GETLK => "getlk",
            SETLK => "setlk",
            SETLKW => "setlkw",
            ACCESS => "access",
            CREATE => "create",
            INTERRUPT => "interrupt",
            BMAP => "bmap",
            DESTROY => "destroy",
            IOCTL => "ioctl",
            POLL => "poll",
            NOTIFY_REPLY => "notify_reply",
            BATCH_FORGET => "batch_forget",
            FALLOCATE => "fallocate",
            READDIRPLUS => "readdirplus",
            RENAME2 => "rename2",
            LSEEK => "lseek",
            COPY_FILE_RANGE => "copy_file_range",
            SETUPMAPPING => "setupmapping",
            REMOVEMAPPING => "removemapping",
            SYNCFS => "syncfs",
            TMPFILE => "tmpfile",
            STATX => "statx",
            COPY_FILE_RANGE_64 => "copy_file_range_64",
            _ => "unknown",
        }
    }
}

/// INIT flags (`flags` holds bits 0-31, `flags2` bits 32-63).
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
    pub const REQUEST_TIMEOUT: u64 = 1 << 42;

    /// Names for `lanefs stats`, in bit order.
    pub const NAMES: &[(u64, &str)] = &[
        (ASYNC_READ, "ASYNC_READ"),
        (POSIX_LOCKS, "POSIX_LOCKS"),
        (FILE_OPS, "FILE_OPS"),
        (ATOMIC_O_TRUNC, "ATOMIC_O_TRUNC"),
        (EXPORT_SUPPORT, "EXPORT_SUPPORT"),
        (BIG_WRITES, "BIG_WRITES"),
        (DONT_MASK, "DONT_MASK"),
        (SPLICE_WRITE, "SPLICE_WRITE"),
        (SPLICE_MOVE, "SPLICE_MOVE"),
        (SPLICE_READ, "SPLICE_READ"),
        (FLOCK_LOCKS, "FLOCK_LOCKS"),
        (HAS_IOCTL_DIR, "HAS_IOCTL_DIR"),
        (AUTO_INVAL_DATA, "AUTO_INVAL_DATA"),
        (DO_READDIRPLUS, "DO_READDIRPLUS"),
        (READDIRPLUS_AUTO, "READDIRPLUS_AUTO"),
        (ASYNC_DIO, "ASYNC_DIO"),
        (WRITEBACK_CACHE, "WRITEBACK_CACHE"),
        (NO_OPEN_SUPPORT, "NO_OPEN_SUPPORT"),
        (PARALLEL_DIROPS, "PARALLEL_DIROPS"),
        (HANDLE_KILLPRIV, "HANDLE_KILLPRIV"),
        (POSIX_ACL, "POSIX_ACL"),
        (ABORT_ERROR, "ABORT_ERROR"),
        (MAX_PAGES, "MAX_PAGES"),
        (CACHE_SYMLINKS, "CACHE_SYMLINKS"),
        (NO_OPENDIR_SUPPORT, "NO_OPENDIR_SUPPORT"),
        (EXPLICIT_INVAL_DATA, "EXPLICIT_INVAL_DATA"),
        (MAP_ALIGNMENT, "MAP_ALIGNMENT"),
        (SUBMOUNTS, "SUBMOUNTS"),
        (HANDLE_KILLPRIV_V2, "HANDLE_KILLPRIV_V2"),
        (SETXATTR_EXT, "SETXATTR_EXT"),
        (INIT_EXT, "INIT_EXT"),
        (SECURITY_CTX, "SECURITY_CTX"),
        (HAS_INODE_DAX, "HAS_INODE_DAX"),
        (CREATE_SUPP_GROUP, "CREATE_SUPP_GROUP"),
        (HAS_EXPIRE_ONLY, "HAS_EXPIRE_ONLY"),
        (DIRECT_IO_ALLOW_MMAP, "DIRECT_IO_ALLOW_MMAP"),
        (PASSTHROUGH, "PASSTHROUGH"),
        (NO_EXPORT_SUPPORT, "NO_EXPORT_SUPPORT"),
        (HAS_RESEND, "HAS_RESEND"),
        (ALLOW_IDMAP, "ALLOW_IDMAP"),
        (OVER_IO_URING, "OVER_IO_URING"),
        (REQUEST_TIMEOUT, "REQUEST_TIMEOUT"),
    ];

    /// Human-readable list of the set bits, e.g. "ASYNC_READ|BIG_WRITES".
    pub fn describe(flags: u64) -> String {
        let names: Vec<&str> = NAMES
            .iter()
            .filter(|(bit, _)| flags & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        names.join("|")
    }
}

/// Flags of fuse_open_out.open_flags.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// Bits of fuse_setattr_in.valid.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// Bits of fuse_write_in.write_flags.
pub mod write_flags {
    pub const CACHE: u32 = 1 << 0;
    pub const LOCKOWNER: u32 = 1 << 1;
    pub const KILL_SUIDGID: u32 = 1 << 2;
}

/// fuse_open_in.open_flags: the kernel asks the server to kill suid/sgid (HANDLE_KILLPRIV_V2).
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// fuse_getattr_in.getattr_flags: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// fuse_release_in.release_flags.
pub const RELEASE_FLUSH: u32 = 1 << 0;
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// fuse_lk_in.lk_flags: the lock is a flock(2) lock, not a POSIX record lock.
pub const LK_FLOCK: u32 = 1 << 0;
/// fuse_setxattr_in.setxattr_flags: clear the SGID bit when setting a POSIX ACL.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// Size of fuse_setxattr_in without SETXATTR_EXT.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// fuse_attr.flags: the inode is a submount root / DAX.
pub const ATTR_SUBMOUNT: u32 = 1 << 0;

/// Smallest read buffer the kernel accepts for /dev/fuse reads.
pub const MIN_READ_BUFFER: usize = 8192;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FileLock {
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    pub pid: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ForgetIn {
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetattrIn {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RenameIn {
    pub newdir: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatfsOut {
    pub st: Kstatfs,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FsyncIn {
    pub fh: u64,
    /// FSYNC_FDATASYNC or 0.
    pub fsync_flags: u32,
    pub padding: u32,
}

/// FsyncIn.fsync_flags: only the data (fdatasync).
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub lk: FileLock,
    pub lk_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LkOut {
    pub lk: FileLock,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// The first 16 bytes of fuse_init_in: all that kernels before 7.36 send.
pub const COMPAT_INIT_IN_SIZE: usize = 16;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InterruptIn {
    pub unique: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BmapIn {
    pub block: u64,
    pub blocksize: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the extensions after the op header, in units of 8 bytes.
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
    // followed by the name, padded to 8 bytes
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DirentPlus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LseekOut {
    pub offset: u64,
}

/// FUSE_IOCTL's argument: the kernel sends `in_size` bytes of input after it and takes up to
/// `out_size` bytes back after [`IoctlOut`] (restricted ioctls: sizes from the command's
/// encoding, or the kernel's own for the file-attribute ioctls it forwards).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IoctlOut {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

/// `IoctlIn.flags`.
pub mod ioctl_flags {
    /// A 32-bit caller on a 64-bit kernel.
    pub const COMPAT: u32 = 1 << 0;
    /// CUSE only: the server names the buffers itself (RETRY).
    pub const UNRESTRICTED: u32 = 1 << 1;
    pub const RETRY: u32 = 1 << 2;
    pub const IOCTL_32BIT: u32 = 1 << 3;
    /// The file is a directory (fh is an opendir handle).
    pub const DIR: u32 = 1 << 4;
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CopyFileRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CopyFileRangeOut {
    pub bytes_copied: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SyncfsIn {
    pub padding: u64,
}

/// Argument of FUSE_DEV_IOC_BACKING_OPEN.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BackingMap {
    pub fd: i32,
    pub flags: u32,
    pub padding: u64,
}

/// Notification codes (sent with unique 0, the code in the out header's error field).
pub mod notify {
    pub const POLL: i32 = 1;
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
    pub const RETRIEVE: i32 = 5;
    pub const DELETE: i32 = 6;
    pub const RESEND: i32 = 7;
    pub const INC_EPOCH: i32 = 8;
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyInvalInodeOut {
    pub ino: u64,
    pub off: i64,
    pub len: i64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyInvalEntryOut {
    pub parent: u64,
    pub namelen: u32,
    pub flags: u32,
}

// ---- FUSE over io_uring (7.43+) ----

/// Size of the in/out header area of a ring entry's header buffer.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of the op-specific header area of a ring entry's header buffer.
pub const URING_OP_IN_OUT_SZ: usize = 128;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringEntInOut {
    pub flags: u64,
    /// Set by the kernel when it hands a request over; returned in the commit.
    pub commit_id: u64,
    /// Bytes of payload in the payload buffer (request or reply).
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// The header buffer of one ring entry, shared with the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringReqHeader {
    /// fuse_in_header of a request, fuse_out_header of a reply.
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    /// The op's fixed-size argument struct (request) or reply struct.
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

pub mod uring_cmd {
    pub const REGISTER: u32 = 1;
    pub const COMMIT_AND_FETCH: u32 = 2;
}

/// The 80-byte command area of an IORING_OP_URING_CMD SQE for FUSE.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

// ioctls on /dev/fuse: _IOR(229, 0, u32), _IOW(229, 1, struct fuse_backing_map), _IOW(229, 2, u32)
pub const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;
pub const FUSE_DEV_IOC_BACKING_OPEN: u64 = 0x4010_e501;
pub const FUSE_DEV_IOC_BACKING_CLOSE: u64 = 0x4004_e502;

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Attr>() == 88);
    assert!(size_of::<Kstatfs>() == 80);
    assert!(size_of::<FileLock>() == 24);
    assert!(size_of::<EntryOut>() == 128);
    assert!(size_of::<ForgetIn>() == 8);
    assert!(size_of::<ForgetOne>() == 16);
    assert!(size_of::<BatchForgetIn>() == 8);
    assert!(size_of::<GetattrIn>() == 16);
    assert!(size_of::<AttrOut>() == 104);
    assert!(size_of::<MknodIn>() == 16);
    assert!(size_of::<MkdirIn>() == 8);
    assert!(size_of::<RenameIn>() == 8);
    assert!(size_of::<Rename2In>() == 16);
    assert!(size_of::<LinkIn>() == 8);
    assert!(size_of::<SetattrIn>() == 88);
    assert!(size_of::<OpenIn>() == 8);
    assert!(size_of::<CreateIn>() == 16);
    assert!(size_of::<OpenOut>() == 16);
    assert!(size_of::<ReleaseIn>() == 24);
    assert!(size_of::<FlushIn>() == 24);
    assert!(size_of::<ReadIn>() == 40);
    assert!(size_of::<WriteIn>() == 40);
    assert!(size_of::<WriteOut>() == 8);
    assert!(size_of::<StatfsOut>() == 80);
    assert!(size_of::<FsyncIn>() == 16);
    assert!(size_of::<SetxattrIn>() == 16);
    assert!(size_of::<GetxattrIn>() == 8);
    assert!(size_of::<GetxattrOut>() == 8);
    assert!(size_of::<LkIn>() == 48);
    assert!(size_of::<LkOut>() == 24);
    assert!(size_of::<AccessIn>() == 8);
    assert!(size_of::<InitIn>() == 64);
    assert!(size_of::<InitOut>() == 64);
    assert!(size_of::<InterruptIn>() == 8);
    assert!(size_of::<BmapIn>() == 16);
    assert!(size_of::<InHeader>() == 40);
    assert!(size_of::<OutHeader>() == 16);
    assert!(size_of::<Dirent>() == 24);
    assert!(size_of::<DirentPlus>() == 152);
    assert!(size_of::<FallocateIn>() == 32);
    assert!(size_of::<LseekIn>() == 24);
    assert!(size_of::<LseekOut>() == 8);
    assert!(size_of::<IoctlIn>() == 32);
    assert!(size_of::<IoctlOut>() == 16);
    assert!(size_of::<CopyFileRangeIn>() == 56);
    assert!(size_of::<CopyFileRangeOut>() == 8);
    assert!(size_of::<BackingMap>() == 16);
    assert!(size_of::<NotifyInvalInodeOut>() == 24);
    assert!(size_of::<NotifyInvalEntryOut>() == 16);
    assert!(size_of::<UringEntInOut>() == 32);
    assert!(size_of::<UringReqHeader>() == 288);
    assert!(size_of::<UringCmdReq>() == 24);
};
