//! The passthrough file system: a host directory (SOURCE) exported as is.
//!
//! Module map: `sys` wraps every syscall (all the `unsafe`), `creds` acts as the caller,
//! `inode` is the sharded inode table, `fdcache` the bounded cache of O_PATH fds reopened from
//! file handles, `handle` the open files and directories, `gate` the per-inode write gate,
//! `counters` what `lanefs stats` shows. The operations live by kind: `entries` (names),
//! `attrs` (attributes, xattrs, statfs), `fileattr` (chattr's flags, through ioctls),
//! `files` (data), `locks`, `dir`.
//!
//! Safety of the export: the kernel hands us nodeids and single names. A name is checked to
//! be one component (no `/`, `.` or `..`) and resolved with `*at` calls relative to its
//! parent's fd with symlinks never followed, so no request reaches outside SOURCE; inodes are
//! reopened from their file handles, never from paths.

mod attrs;
mod counters;
mod creds;
mod dir;
mod entries;
mod fdcache;
mod fileattr;
mod files;
mod gate;
mod handle;
mod inode;
mod locks;
mod sys;

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lanefs_fuse::abi::{self, init_flags};
use lanefs_fuse::caller::Waiting;
use lanefs_fuse::{Connection, Filesystem, InitRequest, Reply, Request};

use counters::Counters;
use creds::Credentials;
use fdcache::FdCache;
use handle::{HandleTable, OpenDir, OpenFile};
use inode::{DeviceTags, HostRef, Inode, InodeKey, InodeTable};
use locks::LockTable;
use sys::{Errno, SysResult};

/// Options of the passthrough file system (`lanefs mount SOURCE MOUNTPOINT ...`).
#[derive(Debug, Clone)]
pub struct PassthroughOptions {
    pub source: PathBuf,
    /// Every open bypasses the page cache (FOPEN_DIRECT_IO), as O_DIRECT opens always do.
    pub direct_io: bool,
    /// Kernel passthrough (FOPEN_PASSTHROUGH) for page-cache opens of regular files, as root.
    pub passthrough: bool,
    /// Direct writes that do not extend a file run in parallel (seed 000).
    pub parallel_writes: bool,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    /// At most this many O_PATH fds are kept open for known inodes.
    pub fd_cache: usize,
    /// Negotiate FUSE_HANDLE_KILLPRIV_V2: we strip set-user-id bits ourselves, which spares
    /// the kernel a GETXATTR(security.capability) round trip per write.
    pub killpriv_v2: bool,
    /// Know inodes by file handle; off keeps an O_PATH fd per known inode.
    pub file_handles: bool,
    /// The FUSE mount's atime flags, which the host must apply to the daemon's own reads.
    pub atime: Atime,
    /// Answer every open FOPEN_NOFLUSH (`--no-flush-on-close`): the kernel then sends no
    /// FLUSH at close(2), two synchronous round trips of `echo x > f` (bash closes the
    /// file twice, after its dup2 and when it restores stdout). FLUSH is what releases a
    /// closing process's POSIX locks held on the host, so POSIX locks are then left to the
    /// kernel (no FUSE_POSIX_LOCKS in INIT): exact between processes using this mount,
    /// invisible to processes on the host, which no longer see or wait for them.
    pub flush_on_close: bool,
}

// When reading a file or listing a directory updates its access time: the FUSE mount's
// atime flags. FUSE inodes are S_NOATIME (the kernel leaves atime to the server), so what
// decides is the rule of the host mount the daemon (and kernel passthrough, whose backing
// files are opened from the daemon's) reads through. As root the daemon reaches SOURCE
// through a private copy of its mount tree whose atime flags are these, so the host applies
// the FUSE mount's rule, exactly as the kernel would (`PassthroughFs::set_atime` changes
// it on remount).
pub use lanefs_fuse::atime::{Atime, AtimeRule};

/// The MOUNT_ATTR_* bits of an atime rule, for mount_setattr.
fn mount_attr(atime: Atime) -> u64 {
    let rule = match atime.rule {
        AtimeRule::Relative => libc::MOUNT_ATTR_RELATIME,
        AtimeRule::Always => libc::MOUNT_ATTR_STRICTATIME,
        AtimeRule::Never => libc::MOUNT_ATTR_NOATIME,
    };
    if atime.directories {
        rule
    } else {
        rule | libc::MOUNT_ATTR_NODIRATIME
    }
}

impl PassthroughOptions {
    pub fn new(source: PathBuf) -> Self {
        PassthroughOptions {
            source,
            direct_io: false,
            passthrough: true,
            parallel_writes: true,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            fd_cache: 4096,
            killpriv_v2: true,
            file_handles: true,
            atime: Atime::default(),
            flush_on_close: true,
        }
    }
}

/// What INIT settled that changes how we answer.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    session_fd: i32,
    passthrough: bool,
    killpriv_v2: bool,
    /// Modes arrive without the caller's umask, which comes beside them (DONT_MASK).
    dont_mask: bool,
    /// Requests come over io_uring, where one worker serves every request of its CPU.
    per_cpu_queues: bool,
}

/// The passthrough file system: a handle on its state, cloned into the jobs that answer slow
/// requests off their queue (see [`PassthroughFs::answer_off_queue`]).
#[derive(Clone)]
pub struct PassthroughFs(Arc<State>);

impl std::ops::Deref for PassthroughFs {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0
    }
}

pub struct State {
    opts: PassthroughOptions,
    creds: Credentials,
    inodes: InodeTable,
    /// The tags that keep inode numbers from different host devices apart.
    devices: DeviceTags,
    fds: FdCache,
    files: HandleTable<OpenFile>,
    dirs: HandleTable<OpenDir>,
    locks: LockTable,
    counters: Counters,
    negotiated: OnceLock<Negotiated>,
    /// Set when a backing open failed in a way every later one would (no CAP_SYS_ADMIN, stack
    /// too deep): later opens do not try.
    passthrough_broken: AtomicBool,
    /// A host file system without file handles was met (the warning is logged once).
    handles_missing: AtomicBool,
    /// SOURCE opened for reading: the mount fd of the inodes on SOURCE's own mount.
    root_mount: Arc<OwnedFd>,
    /// Passthrough stacking depth to ask for: 2 when SOURCE is itself on FUSE or overlayfs.
    stack_depth: u32,
    /// The root of our private copy of SOURCE's mount tree (see [`Atime`]), when we could
    /// make one (root).
    tree: Option<Arc<OwnedFd>>,
    /// Without that copy, a `noatime` mount opens host files with O_NOATIME where the host
    /// allows it (files the daemon's user owns).
    noatime_opens: AtomicBool,
    /// The FUSE mount's atime flags ([`Atime::to_bits`]), changed by a remount: a page-cache
    /// open after which a read must move atime drops the cache, so that the read reaches
    /// the host (`files::finish_open`).
    atime: std::sync::atomic::AtomicU8,
    /// The origin of `now_ns`, the clock of cached answers' expiry.
    clock: std::time::Instant,
}

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
/// The write-only fd a truncate by path goes through: O_NONBLOCK, so that a host lease on
/// the file answers EWOULDBLOCK (its break started) instead of blocking the open.
const TRUNCATE_OPEN_FLAGS: i32 = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;

impl PassthroughFs {
    /// Opens SOURCE; fails with a sentence when it is missing or not a directory.
    pub fn new(mut opts: PassthroughOptions) -> io::Result<PassthroughFs> {
        let shown = opts.source.display().to_string();
        let fail = |what: &str, errno: Errno| {
            io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!("{what} {shown}: {}", io::Error::from_raw_os_error(errno)),
            )
        };
        let not_a_directory = || {
            io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("source {shown} is not a directory"),
            )
        };
        let path = std::ffi::CString::new(opts.source.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in SOURCE"))?;
        // SOURCE itself is the user's path: symlinks in it are followed (only here).
        let root_fd = sys::open_source(&path).map_err(|e| match e {
            libc::ENOTDIR => not_a_directory(),
            _ => fail("cannot open source directory", e),
        })?;
        let (root_fd, tree) = private_tree(root_fd, opts.atime);
        let st = sys::fstat(&root_fd).map_err(|e| fail("cannot stat", e))?;
        let root_mount = sys::reopen(&root_fd, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| fail("cannot open source directory", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(not_a_directory());
        }
        let fs_type = sys::fstatfs(&root_fd).map_or(0, |s| s.f_type);
        let stack_depth = if fs_type == FUSE_SUPER_MAGIC || fs_type == OVERLAYFS_SUPER_MAGIC {
            2
        } else {
            1
        };
        // The fd cache takes at most half the open-file limit: the rest is for open files,
        // the queues and the kernel's lock and backing needs.
        let fd_limit = sys::raise_open_file_limit();
        let fd_cache_max = usize::try_from(fd_limit / 2).unwrap_or(usize::MAX);
        if opts.fd_cache > fd_cache_max {
            tracing::warn!(
                "--fd-cache {} is more than half the open-file limit ({fd_limit}): using {}",
                opts.fd_cache,
                fd_cache_max
            );
            opts.fd_cache = fd_cache_max;
        }
        let handles_missing = AtomicBool::new(false);
        let mut mount_id = -1;
        if opts.file_handles {
            // Reopening by handle needs CAP_DAC_READ_SEARCH as well as host support: try both.
            let reopened = sys::handle_of(&root_fd).and_then(|(handle, id)| {
                sys::open_by_handle(&root_mount, &handle, libc::O_PATH).map(|_| id)
            });
            match reopened {
                Ok(id) => mount_id = id,
                Err(e) => {
                    warn_no_handles(&shown, e);
                    handles_missing.store(true, Ordering::Relaxed);
                    opts.file_handles = false;
                }
            }
        } else {
            tracing::info!("--no-file-handles: keeping an O_PATH fd per known inode");
        }
        let opts_atime_never = opts.atime.rule == AtimeRule::Never;
        let atime_bits = opts.atime.to_bits();
        let root = Inode::new(
            abi::ROOT_ID,
            InodeKey {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            0,
            libc::S_IFDIR,
            mount_id,
            HostRef::Fd(root_fd),
            0,
        );
        Ok(PassthroughFs(Arc::new(State {
            fds: FdCache::new(opts.fd_cache),
            opts,
            creds: Credentials::of_this_process(),
            inodes: InodeTable::new(root),
            devices: DeviceTags::new(st.st_dev),
            files: HandleTable::new(),
            dirs: HandleTable::new(),
            locks: LockTable::new(),
            counters: Counters::default(),
            negotiated: OnceLock::new(),
            passthrough_broken: AtomicBool::new(false),
            handles_missing,
            root_mount: Arc::new(root_mount),
            stack_depth,
            noatime_opens: AtomicBool::new(tree.is_none() && opts_atime_never),
            atime: std::sync::atomic::AtomicU8::new(atime_bits),
            tree,
            clock: std::time::Instant::now(),
        })))
    }

    /// Applies new atime flags of the FUSE mount (a remount) to the daemon's own reads.
    pub fn set_atime(&self, atime: Atime) {
        self.atime.store(atime.to_bits(), Ordering::Relaxed);
        match &self.tree {
            Some(tree) => {
                if let Err(e) = sys::set_tree_atime(tree, mount_attr(atime)) {
                    tracing::warn!(
                        "cannot apply the mount's new atime flags to the daemon's reads: {}",
                        io::Error::from_raw_os_error(e)
                    );
                }
            }
            None => self
                .noatime_opens
                .store(atime.rule == AtimeRule::Never, Ordering::Relaxed),
        }
    }

    /// A SETATTR with a size (off the queue). A truncate by path (no writable open given)
    /// opens the file for writing first, which breaks a host process's lease on it: that
    /// open waits for the break on the wait list, as a client's open does, never in the
    /// syscall (up to lease-break-time, 45 s, holding an offload thread), and the file's
    /// write gate is taken only once it is open.
    fn truncate(&self, req: Request, ino: u64, arg: abi::SetattrIn, reply: Reply) {
        let writable_open =
            arg.valid & abi::fattr::FH != 0 && self.files.get(arg.fh).is_some_and(|f| f.writable());
        if writable_open {
            return self.answer_setattr(&req, ino, &arg, None, reply);
        }
        let inode = match self.inode(ino) {
            Ok(inode) => inode,
            Err(e) => return reply.error(e),
        };
        match self.open_inode(&inode, TRUNCATE_OPEN_FLAGS) {
            Ok(writer) => self.answer_setattr(&req, ino, &arg, Some(writer), reply),
            Err(libc::EWOULDBLOCK) => {
                let fs = self.clone();
                let attempt = move || -> SysResult<locks::Answer> {
                    let writer = fs.open_inode(&inode, TRUNCATE_OPEN_FLAGS)?;
                    let fs = fs.clone();
                    Ok(Box::new(move |reply: Reply| {
                        // The truncate itself on the offload pool, not the waiting thread.
                        fs.answer_off_queue(reply, move |fs, reply| {
                            fs.answer_setattr(&req, ino, &arg, Some(writer), reply)
                        })
                    }))
                };
                self.locks
                    .wait_for_open(Waiting::of(&req), ino, reply, Box::new(attempt));
            }
            Err(e) => reply.error(e),
        }
    }

    /// Answers SETATTR with `do_setattr`'s outcome.
    fn answer_setattr(
        &self,
        req: &Request,
        ino: u64,
        arg: &abi::SetattrIn,
        writer: Option<OwnedFd>,
        reply: Reply,
    ) {
        answer(reply, self.do_setattr(req, ino, arg, writer), |r, a| {
            r.attr(&a)
        })
    }

    /// Answers a request that may take long (a sync, a copy, a wait on the host) from the
    /// engine's offload pool, so that it never holds a queue's worker: over io_uring that
    /// worker serves every request of its CPU, and a truncate of a large file or an open
    /// stuck on a lease break would make the stat and lseek calls of the CPU's other callers
    /// wait (seed 002's guarantee); over /dev/fuse it takes one of few workers away.
    fn answer_off_queue(
        &self,
        reply: Reply,
        job: impl FnOnce(&PassthroughFs, Reply) + Send + 'static,
    ) {
        let fs = self.clone();
        reply.offload(move |reply| job(&fs, reply));
    }

    /// Answers an open whose host fd is `fd`: at once, or from the offload pool when it
    /// truncates (an O_TRUNC open of a large file takes long).
    fn answer_open(
        &self,
        req: &Request,
        inode: Arc<Inode>,
        fd: OwnedFd,
        arg: &abi::OpenIn,
        reply: Reply,
    ) {
        if arg.flags as i32 & libc::O_TRUNC == 0 {
            return answer(reply, self.complete_open(req, &inode, fd, arg), |r, o| {
                r.open(&o)
            });
        }
        let (req, arg) = (*req, *arg);
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.complete_open(&req, &inode, fd, &arg), |r, o| {
                r.open(&o)
            })
        })
    }

    /// Whether requests come over io_uring, where a ring's one worker serves every request of
    /// its CPU, so a slow one makes the CPU's other callers wait: fsync and readdirplus of a
    /// large directory then go to the offload pool. Over /dev/fuse each queue has its own
    /// worker and any idle one takes the next request, so they are answered in place (a
    /// handoff to the pool would only add two thread switches).
    fn workers_serve_a_cpu(&self) -> bool {
        self.negotiated().is_some_and(|n| n.per_cpu_queues)
    }

    /// Nanoseconds since the file system started (monotonic), for expiries.
    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn inode(&self, nodeid: u64) -> SysResult<Arc<Inode>> {
        // The kernel only names nodeids we gave it and has not forgotten.
        self.inodes.get(nodeid).ok_or(libc::ESTALE)
    }

    /// An O_PATH fd of the inode: its own (borrowed: no reference count touched), or one
    /// from the fd cache.
    fn path_fd<'a>(&self, inode: &'a Inode) -> SysResult<PathFd<'a>> {
        match &inode.host {
            HostRef::Fd(fd) => Ok(PathFd::Kept(fd)),
            HostRef::Handle { handle, mount } => self
                .fds
                .get_or_open(inode.nodeid, || {
                    sys::open_by_handle(mount, handle, libc::O_PATH | libc::O_NOFOLLOW)
                })
                .map(PathFd::Cached),
        }
    }

    /// A new fd of the inode opened with `flags` (for an open file, a truncate, a listing).
    fn open_inode(&self, inode: &Inode, flags: i32) -> SysResult<OwnedFd> {
        let open = |flags| match &inode.host {
            HostRef::Fd(fd) => sys::reopen(fd, flags),
            HostRef::Handle { handle, mount } => sys::open_by_handle(mount, handle, flags),
        };
        if self.noatime_opens.load(Ordering::Relaxed) {
            // O_NOATIME is refused (EPERM) on files the daemon's user does not own.
            match open(flags | libc::O_NOATIME) {
                Err(libc::EPERM) => {}
                done => return done,
            }
        }
        open(flags)
    }

    fn negotiated(&self) -> Option<Negotiated> {
        self.negotiated.get().copied()
    }

    fn killpriv_v2(&self) -> bool {
        self.negotiated().is_some_and(|n| n.killpriv_v2)
    }

    /// The attributes of `inode` from its host stat `st`, with the inode number it is shown
    /// under (see [`inode::shown_ino`]).
    fn attr(inode: &Inode, st: &libc::stat) -> abi::Attr {
        abi::Attr {
            ino: inode::shown_ino(inode.dev_tag, st.st_ino),
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: st.st_atime as u64,
            mtime: st.st_mtime as u64,
            ctime: st.st_ctime as u64,
            atimensec: st.st_atime_nsec as u32,
            mtimensec: st.st_mtime_nsec as u32,
            ctimensec: st.st_ctime_nsec as u32,
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: encode_dev(st.st_rdev),
            blksize: st.st_blksize as u32,
            flags: 0,
        }
    }

    /// How long the kernel may cache `inode`'s attributes, where they may change on the host
    /// without a request telling us; None: the mount's attribute timeout.
    /// - A set-ID file with passthrough writers that lose the bits on the host: not at all
    ///   (the kernel does not refetch the mode after a passthrough write, and a cached mode
    ///   would show set-ID bits already gone).
    /// - Any other file open for writing through kernel passthrough: `MAPPED_WRITE_ATTR_VALID`.
    ///   A write through a shared mapping of it dirties the host file directly (mtime and
    ///   ctime move at the write fault, msync goes to the host file) and no request tells us,
    ///   so only a fresh GETATTR shows them; a write(2) needs no such care (the kernel drops
    ///   the size and times it cached after each). Not 0: a database keeps its files open for
    ///   writing and calls lseek(SEEK_END) dozens of times a transaction, each a GETATTR
    ///   round trip (and the next write one GETXATTR) at 0.
    ///
    /// The common case costs one atomic load (getattr must not wait on an open's lock).
    fn attr_validity(&self, inode: &Inode, st: &libc::stat) -> Option<Duration> {
        let writers = inode.passthrough_writers.load(Ordering::Relaxed) > 0;
        let set_id = st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0;
        if set_id && inode.open_state().backing.is_some_and(|b| !b.keeps_set_id) {
            return Some(Duration::ZERO);
        }
        writers.then_some(MAPPED_WRITE_ATTR_VALID.min(self.opts.attr_timeout))
    }

    /// The attributes answer for `inode` (cached briefly or not at all: [`Self::attr_validity`]).
    /// `generation` is the inode's mode generation read before `st` was taken.
    fn attr_out(&self, inode: &Inode, st: &libc::stat, generation: u64) -> abi::AttrOut {
        inode.saw_mode(st.st_mode, generation);
        let timeout = self
            .attr_validity(inode, st)
            .unwrap_or(self.opts.attr_timeout);
        let (secs, nsecs) = split(timeout);
        abi::AttrOut {
            attr_valid: secs,
            attr_valid_nsec: nsecs,
            dummy: 0,
            attr: Self::attr(inode, st),
        }
    }

    fn entry_out(&self, inode: &Inode, st: &libc::stat) -> abi::EntryOut {
        let (entry_secs, entry_nsecs) = split(self.opts.entry_timeout);
        let (attr_secs, attr_nsecs) = split(self.opts.attr_timeout);
        abi::EntryOut {
            nodeid: inode.nodeid,
            generation: 0,
            entry_valid: entry_secs,
            attr_valid: attr_secs,
            entry_valid_nsec: entry_nsecs,
            attr_valid_nsec: attr_nsecs,
            attr: Self::attr(inode, st),
        }
    }

    /// Makes the host object `found` refers to (with stat `st`, a child of `parent`) known
    /// to the kernel: finds or adds its inode and counts one lookup. `keep_fd` makes the
    /// inode keep an O_PATH fd instead of a file handle.
    fn register(
        &self,
        parent: &Inode,
        found: Found<'_>,
        keep_fd: bool,
        st: &libc::stat,
    ) -> SysResult<Arc<Inode>> {
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let kind = st.st_mode & libc::S_IFMT;
        let mut mount_id = -1;
        let mut seed = None;
        let mut handle = if keep_fd {
            None
        } else {
            self.handle_for(found.fd(), &mut mount_id)?
        };
        // Reopening by handle on another mount needs an open fd of that mount, which only a
        // directory or a regular file can lend without side effects: a device, FIFO or
        // socket bound there is never opened (a tty would become our controlling terminal, a
        // FIFO could block) and keeps its O_PATH fd instead.
        if handle.is_some()
            && mount_id != parent.mount_id
            && kind != libc::S_IFDIR
            && kind != libc::S_IFREG
        {
            handle = None;
            mount_id = -1;
        }
        let host = match handle {
            Some(handle) => {
                let mount = if mount_id == parent.mount_id {
                    parent.mount_fd().unwrap_or(&self.root_mount).clone()
                } else {
                    // The first inode met on another mount lends it its mount fd.
                    Arc::new(sys::reopen(found.fd(), libc::O_RDONLY | libc::O_NONBLOCK)?)
                };
                if let Found::Path(fd) = found {
                    seed = Some(Arc::new(fd));
                }
                HostRef::Handle { handle, mount }
            }
            None => HostRef::Fd(Arc::new(match found {
                Found::Path(fd) => fd,
                Found::Open(fd) => sys::reopen(fd, libc::O_PATH)?,
            })),
        };
        let dev_tag = self
            .devices
            .tag_for(key.dev, key.ino, parent.key.dev, parent.dev_tag);
        let (inode, new) = self.inodes.remember(key, host, |nodeid, host| {
            Inode::new(
                nodeid,
                key,
                dev_tag,
                kind,
                mount_id,
                host,
                st.st_size as u64,
            )
        });
        if !new && inode.is_regular() {
            inode.gate.set_size(st.st_size as u64);
        }
        // A new inode's mode cannot have been changed through us since `st` was taken (for a
        // known one it might: its next getattr records it).
        if new {
            inode.saw_mode(st.st_mode, 0);
        }
        if let Some(fd) = seed
            && matches!(inode.host, HostRef::Handle { .. })
        {
            self.fds.insert(inode.nodeid, fd);
        }
        Ok(inode)
    }

    /// The file handle of `fd`, or None when we keep fds instead (no handle support).
    fn handle_for(&self, fd: &OwnedFd, mount_id: &mut i32) -> SysResult<Option<sys::FileHandle>> {
        if !self.opts.file_handles {
            return Ok(None);
        }
        match sys::handle_of(fd) {
            Ok((handle, id)) => {
                *mount_id = id;
                Ok(Some(handle))
            }
            Err(e @ (libc::EOPNOTSUPP | libc::ENOSYS)) => {
                if !self.handles_missing.swap(true, Ordering::Relaxed) {
                    warn_no_handles(&self.opts.source.display().to_string(), e);
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Looks `name` up in `parent` on the host and makes it known: the entry answer.
    fn lookup_child(&self, parent: &Arc<Inode>, name: &CStr) -> SysResult<abi::EntryOut> {
        let dir = self.path_fd(parent)?;
        let fd = sys::openat(&dir, name, libc::O_PATH, 0)?;
        let st = sys::fstat(&fd)?;
        let inode = self.register(parent, Found::Path(fd), false, &st)?;
        if inode.is_symlink() {
            inode.set_link_name(parent.clone(), name.to_owned());
        }
        let mut entry = self.entry_out(&inode, &st);
        if inode.is_regular()
            && let Some(validity) = self.attr_validity(&inode, &st)
        {
            (entry.attr_valid, entry.attr_valid_nsec) = split(validity);
        }
        Ok(entry)
    }

    /// Undoes the lookup count of an entry the kernel will not learn of (a create whose open
    /// failed after the file was made known).
    fn unregister(&self, nodeid: u64) {
        if self.inodes.forget(nodeid, 1) {
            self.fds.remove(nodeid);
        }
    }
}

/// An inode's O_PATH fd for one request: the inode's own, or the fd cache's (which stays
/// open while the request holds it, even if the cache evicts it meanwhile).
enum PathFd<'a> {
    Kept(&'a OwnedFd),
    Cached(Arc<OwnedFd>),
}

impl std::ops::Deref for PathFd<'_> {
    type Target = OwnedFd;

    fn deref(&self) -> &OwnedFd {
        match self {
            PathFd::Kept(fd) => fd,
            PathFd::Cached(fd) => fd,
        }
    }
}

/// How `register` got hold of a host object.
enum Found<'a> {
    /// An O_PATH fd of it: cached (or kept) for later path operations.
    Path(OwnedFd),
    /// An fd opened for I/O (a create's): used for its handle only.
    Open(&'a OwnedFd),
}

impl Found<'_> {
    fn fd(&self) -> &OwnedFd {
        match self {
            Found::Path(fd) => fd,
            Found::Open(fd) => fd,
        }
    }
}

/// The fd SOURCE is reached through: the root of a private copy of its mount tree with the
/// FUSE mount's atime flags (see [`Atime`]), or, where that cannot be made (a regular user),
/// `opened` itself. The copy is returned a second time as the tree to change on remount.
fn private_tree(opened: OwnedFd, atime: Atime) -> (Arc<OwnedFd>, Option<Arc<OwnedFd>>) {
    let copy = sys::clone_tree(&opened).and_then(|tree| {
        sys::set_tree_atime(&tree, mount_attr(atime))?;
        Ok(Arc::new(tree))
    });
    match copy {
        Ok(tree) => (tree.clone(), Some(tree)),
        Err(e) => {
            if atime != Atime::default() {
                tracing::warn!(
                    "cannot copy the mount tree of the source ({}; it needs CAP_SYS_ADMIN): the \
                     daemon's own reads follow the host's atime rule, not this mount's{}",
                    io::Error::from_raw_os_error(e),
                    if atime.rule == AtimeRule::Never {
                        " (noatime: files the daemon's user owns are read with O_NOATIME)"
                    } else {
                        ""
                    }
                );
            }
            (Arc::new(opened), None)
        }
    }
}

fn warn_no_handles(source: &str, errno: Errno) {
    tracing::warn!(
        "cannot use file handles under {source} ({}; they need host support and \
         CAP_DAC_READ_SEARCH): keeping an O_PATH fd per known inode instead, so a walk of \
         many files can hit the open-file limit",
        io::Error::from_raw_os_error(errno)
    );
}

/// How long the kernel may cache the attributes of a file open for writing through kernel
/// passthrough (see `PassthroughFs::attr_validity`): what a stat may lag behind a write
/// through a shared mapping. A few ticks of the clock file times come from (4 ms at
/// HZ=250), where a native stat would show the fault's time.
const MAPPED_WRITE_ATTR_VALID: Duration = Duration::from_millis(10);

fn split(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// The kernel's `new_encode_dev`: the 32-bit device number FUSE carries.
fn encode_dev(dev: libc::dev_t) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The kernel's `new_decode_dev`.
fn decode_dev(dev: u32) -> libc::dev_t {
    let major = (dev & 0xfff00) >> 8;
    let minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

/// Answers with `result`'s error, or lets `ok` answer.
fn answer<T>(reply: Reply, result: SysResult<T>, ok: impl FnOnce(Reply, T)) {
    match result {
        Ok(value) => ok(reply, value),
        Err(errno) => reply.error(errno),
    }
}

impl Filesystem for PassthroughFs {
    fn init(&self, offered: u64) -> InitRequest {
        let mut want = init_flags::DO_READDIRPLUS
            | init_flags::READDIRPLUS_AUTO
            | init_flags::FLOCK_LOCKS
            | init_flags::ATOMIC_O_TRUNC
            | init_flags::CACHE_SYMLINKS
            | init_flags::AUTO_INVAL_DATA
            // The kernel checks permissions with the host's ACLs (fetched through
            // getxattr and cached), the host applies default ACLs and the caller's umask
            // (DONT_MASK), and setting an access ACL tells us to drop set-group-ID
            // (SETXATTR_EXT's flags).
            | init_flags::POSIX_ACL
            | init_flags::DONT_MASK
            | init_flags::SETXATTR_EXT;
        if self.opts.killpriv_v2 {
            want |= init_flags::HANDLE_KILLPRIV_V2;
        }
        // POSIX locks on the host need FLUSH to be released at close(2) (the kernel keeps
        // no record of locks it forwards); without FLUSH they stay in the kernel.
        if self.opts.flush_on_close {
            want |= init_flags::POSIX_LOCKS;
        }
        // Creates carry the caller's supplementary group in the parent's group (see
        // `creds`); only worth asking for when we act as callers at all.
        if self.creds.can_switch {
            want |= init_flags::CREATE_SUPP_GROUP;
        }
        if self.opts.passthrough && self.creds.can_switch {
            want |= init_flags::PASSTHROUGH;
        }
        if self.opts.passthrough && offered & init_flags::PASSTHROUGH == 0 {
            tracing::info!("the kernel does not offer FUSE passthrough; serving all I/O");
        }
        InitRequest {
            want,
            max_stack_depth: self.stack_depth,
        }
    }

    fn connected(&self, conn: &Connection) {
        let _ = self.negotiated.set(Negotiated {
            session_fd: conn.session_fd,
            passthrough: conn.flags & init_flags::PASSTHROUGH != 0,
            killpriv_v2: conn.flags & init_flags::HANDLE_KILLPRIV_V2 != 0,
            dont_mask: conn.flags & init_flags::DONT_MASK != 0,
            per_cpu_queues: conn.per_cpu_queues,
        });
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let fds = self.fds.counts();
        let c = &self.counters;
        [
            ("getxattr", c.getxattr.get()),
            ("caps_from_memory", c.caps_from_memory.get()),
            ("inodes", self.inodes.live()),
            ("fd_cache_fds", fds.cached),
            ("fd_cache_hits", fds.hits),
            ("fd_cache_misses", fds.misses),
            ("fd_cache_evictions", fds.evictions),
            ("fd_cache_swept", fds.swept),
            ("backing_ids_live", Counters::get(&c.backing_live)),
            ("backing_ids_opened", Counters::get(&c.backing_opened)),
            (
                "passthrough_declined",
                Counters::get(&c.passthrough_declined),
            ),
            ("kill_suidgid", Counters::get(&c.kill_suidgid)),
            ("set_id_checks", Counters::get(&c.set_id_checks)),
            ("lock_waiters", self.locks.waiting()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }

    fn interrupt(&self, unique: u64) {
        self.locks.interrupt(unique)
    }

    fn lookup(&self, _req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        match self.do_lookup(parent, name) {
            Ok(entry) => reply.entry(&entry),
            // A negative entry: the kernel remembers the name is absent for entry_timeout.
            Err(libc::ENOENT) if !self.opts.entry_timeout.is_zero() => {
                let (secs, nsecs) = split(self.opts.entry_timeout);
                reply.entry(&abi::EntryOut {
                    entry_valid: secs,
                    entry_valid_nsec: nsecs,
                    ..Default::default()
                })
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        if self.inodes.forget(ino, nlookup) {
            self.fds.remove(ino);
        }
    }

    fn getattr(&self, _req: &Request, ino: u64, fh: Option<u64>, reply: Reply) {
        answer(reply, self.do_getattr(ino, fh), |r, a| r.attr(&a))
    }

    fn setattr(&self, req: &Request, ino: u64, arg: &abi::SetattrIn, reply: Reply) {
        if arg.valid & abi::fattr::SIZE != 0 {
            let (req, arg) = (*req, *arg);
            return self
                .answer_off_queue(reply, move |fs, reply| fs.truncate(req, ino, arg, reply));
        }
        self.answer_setattr(req, ino, arg, None, reply)
    }

    fn readlink(&self, _req: &Request, ino: u64, reply: Reply) {
        answer(reply, self.do_readlink(ino), |r, t| r.data(&t))
    }

    fn symlink(&self, req: &Request, parent: u64, name: &OsStr, target: &OsStr, reply: Reply) {
        answer(reply, self.do_symlink(req, parent, name, target), |r, e| {
            r.entry(&e)
        })
    }

    fn mknod(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MknodIn, reply: Reply) {
        answer(reply, self.do_mknod(req, parent, name, arg), |r, e| {
            r.entry(&e)
        })
    }

    fn mkdir(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::MkdirIn, reply: Reply) {
        answer(reply, self.do_mkdir(req, parent, name, arg), |r, e| {
            r.entry(&e)
        })
    }

    fn unlink(&self, _req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        answer(reply, self.do_remove(parent, name, 0), |r, ()| r.ok())
    }

    fn rmdir(&self, _req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        answer(
            reply,
            self.do_remove(parent, name, libc::AT_REMOVEDIR),
            |r, ()| r.ok(),
        )
    }

    fn rename(
        &self,
        _req: &Request,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: Reply,
    ) {
        answer(
            reply,
            self.do_rename(parent, name, newparent, newname, flags),
            |r, ()| r.ok(),
        )
    }

    fn link(&self, _req: &Request, ino: u64, newparent: u64, newname: &OsStr, reply: Reply) {
        answer(reply, self.do_link(ino, newparent, newname), |r, e| {
            r.entry(&e)
        })
    }

    fn open(&self, req: &Request, ino: u64, arg: &abi::OpenIn, reply: Reply) {
        let inode = match self.inode(ino) {
            Ok(inode) => inode,
            Err(e) => return reply.error(e),
        };
        let flags = arg.flags as i32;
        match self.open_host(&inode, flags) {
            Ok(fd) => self.answer_open(req, inode, fd, arg, reply),
            // Another process holds a lease on the host file: its break has started. The open
            // waits on the mount's wait list (one thread for all waiters, bounded), tried
            // again without blocking until the holder lets go or the host breaks the lease.
            Err(libc::EWOULDBLOCK) if flags & libc::O_NONBLOCK == 0 => {
                let (fs, req_copy, arg_copy) = (self.clone(), *req, *arg);
                let attempt = move || -> SysResult<locks::Answer> {
                    let fd = fs.open_host(&inode, flags)?;
                    let (fs, inode) = (fs.clone(), inode.clone());
                    Ok(Box::new(move |reply: Reply| {
                        fs.answer_open(&req_copy, inode, fd, &arg_copy, reply)
                    }))
                };
                self.locks
                    .wait_for_open(Waiting::of(req), ino, reply, Box::new(attempt));
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, _req: &Request, ino: u64, arg: &abi::ReadIn, reply: Reply) {
        self.do_read(ino, arg, reply)
    }

    fn write(&self, req: &Request, _ino: u64, arg: &abi::WriteIn, data: &[u8], reply: Reply) {
        match self.do_write(req, arg, data, false) {
            Some(result) => answer(reply, result, |r, n| r.written(n)),
            // It would wait on the write gate (behind a truncate, say): off the worker, with
            // its own copy of the data (the request's buffer goes back to the queue).
            None => {
                let (req, arg, data) = (*req, *arg, data.to_vec());
                self.answer_off_queue(reply, move |fs, reply| {
                    let result = fs.do_write(&req, &arg, &data, true);
                    answer(reply, result.unwrap_or(Err(libc::EIO)), |r, n| r.written(n))
                })
            }
        }
    }

    fn flush(&self, _req: &Request, ino: u64, arg: &abi::FlushIn, reply: Reply) {
        // close(2) drops the closing process's POSIX locks; nothing else to do, as writes
        // are already on the host. Closing the owner's lock fd may flush on the host (a
        // network file system does): off the worker when there is one.
        if !self.locks.holds_owner(ino, arg.lock_owner) {
            return reply.ok();
        }
        let owner = arg.lock_owner;
        self.answer_off_queue(reply, move |fs, reply| {
            fs.locks.release_owner(ino, owner);
            reply.ok()
        })
    }

    fn release(&self, _req: &Request, _ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        self.do_release(arg);
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: u64, arg: &abi::FsyncIn, reply: Reply) {
        if !self.workers_serve_a_cpu() {
            return answer(reply, self.do_fsync(arg), |r, ()| r.ok());
        }
        let arg = *arg;
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.do_fsync(&arg), |r, ()| r.ok())
        })
    }

    fn opendir(&self, _req: &Request, ino: u64, _arg: &abi::OpenIn, reply: Reply) {
        answer(reply, self.do_opendir(ino), |r, o| r.open(&o))
    }

    fn readdir(&self, _req: &Request, _ino: u64, arg: &abi::ReadIn, plus: bool, reply: Reply) {
        if plus && self.workers_serve_a_cpu() && !self.readdirplus_is_small(arg) {
            // A lookup per entry: a large directory's page takes a while.
            let arg = *arg;
            return self.answer_off_queue(reply, move |fs, reply| {
                answer(reply, fs.do_readdir(&arg, true), |r, buf| {
                    r.data(buf.as_bytes())
                })
            });
        }
        answer(reply, self.do_readdir(arg, plus), |r, buf| {
            r.data(buf.as_bytes())
        })
    }

    fn releasedir(&self, _req: &Request, _ino: u64, arg: &abi::ReleaseIn, reply: Reply) {
        self.dirs.remove(arg.fh);
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, _ino: u64, arg: &abi::FsyncIn, reply: Reply) {
        if !self.workers_serve_a_cpu() {
            return answer(reply, self.do_fsyncdir(arg), |r, ()| r.ok());
        }
        let arg = *arg;
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.do_fsyncdir(&arg), |r, ()| r.ok())
        })
    }

    fn statfs(&self, _req: &Request, ino: u64, reply: Reply) {
        answer(reply, self.do_statfs(ino), |r, s| r.statfs(&s))
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
        reply: Reply,
    ) {
        answer(
            reply,
            self.do_setxattr(ino, name, value, flags, setxattr_flags),
            |r, ()| r.ok(),
        )
    }

    fn getxattr(&self, _req: &Request, ino: u64, name: &OsStr, size: u32, reply: Reply) {
        self.counters.getxattr.bump();
        tracing::trace!(ino, ?name, size, "getxattr");
        self.do_getxattr(ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: u64, size: u32, reply: Reply) {
        self.do_listxattr(req, ino, size, reply)
    }

    fn removexattr(&self, _req: &Request, ino: u64, name: &OsStr, reply: Reply) {
        answer(reply, self.do_removexattr(ino, name), |r, ()| r.ok())
    }

    fn access(&self, _req: &Request, ino: u64, mask: u32, reply: Reply) {
        answer(reply, self.do_access(ino, mask), |r, ()| r.ok())
    }

    fn create(&self, req: &Request, parent: u64, name: &OsStr, arg: &abi::CreateIn, reply: Reply) {
        answer(
            reply,
            self.do_create(req, parent, name, arg),
            |r, (e, o)| r.create(&e, &o),
        )
    }

    fn tmpfile(&self, req: &Request, parent: u64, arg: &abi::CreateIn, reply: Reply) {
        answer(reply, self.do_tmpfile(req, parent, arg), |r, (e, o)| {
            r.create(&e, &o)
        })
    }

    fn getlk(&self, _req: &Request, ino: u64, arg: &abi::LkIn, reply: Reply) {
        answer(reply, self.do_getlk(ino, arg), |r, lk| r.lock(&lk))
    }

    fn setlk(&self, req: &Request, ino: u64, arg: &abi::LkIn, sleep: bool, reply: Reply) {
        self.do_setlk(req, ino, arg, sleep, reply)
    }

    fn fallocate(&self, req: &Request, _ino: u64, arg: &abi::FallocateIn, reply: Reply) {
        let (req, arg) = (*req, *arg);
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.do_fallocate(&req, &arg), |r, ()| r.ok())
        })
    }

    fn lseek(&self, _req: &Request, _ino: u64, arg: &abi::LseekIn, reply: Reply) {
        answer(reply, self.do_lseek(arg), |r, off| r.lseek(off))
    }

    fn copy_file_range(&self, req: &Request, _ino: u64, arg: &abi::CopyFileRangeIn, reply: Reply) {
        // Of unbounded length.
        let (req, arg) = (*req, *arg);
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.do_copy_file_range(&req, &arg), |r, n| r.copied(n))
        })
    }

    fn syncfs(&self, _req: &Request, ino: u64, reply: Reply) {
        self.answer_off_queue(reply, move |fs, reply| {
            answer(reply, fs.do_syncfs(ino), |r, ()| r.ok())
        })
    }

    fn ioctl(&self, req: &Request, _ino: u64, arg: &abi::IoctlIn, data: &[u8], reply: Reply) {
        self.do_ioctl(req, arg, data, reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_round_trip_the_kernel_encoding() {
        for (major, minor) in [(0, 0), (1, 3), (8, 17), (259, 65536), (4095, 1 << 19)] {
            let dev = libc::makedev(major, minor);
            assert_eq!(decode_dev(encode_dev(dev)), dev, "{major}:{minor}");
        }
        assert_eq!(encode_dev(libc::makedev(1, 3)), 0x103);
    }

    #[test]
    fn a_missing_or_file_source_is_refused_with_its_path() {
        let err = PassthroughFs::new(PassthroughOptions::new("/nonexistent/lanefs".into()))
            .err()
            .unwrap();
        assert!(err.to_string().contains("/nonexistent/lanefs"), "{err}");
        let err = PassthroughFs::new(PassthroughOptions::new("/etc/hostname".into()))
            .err()
            .unwrap();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
}
