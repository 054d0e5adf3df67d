//! `MetaStore`: the metadata operations the volume's file system calls. Records in, records
//! and errnos out; no SQL leaves the store, so the file system is the same on SQLite and on
//! PostgreSQL (both served by one implementation, `store::SqlStore`).
//!
//! Reads run on the caller's thread (`queue` picks a connection). Changes are handed to the
//! store with a completion, [`Done`], which the store calls once, after the transaction that
//! holds the change committed (`Ok`), or with the errno that stopped it. A completion may run
//! on another thread (the store's committer); it answers the FUSE request there.

/// An errno.
pub type Errno = i32;

/// Called once with the outcome of a change, after its transaction committed or failed.
pub type Done<T> = Box<dyn FnOnce(Result<T, Errno>) + Send>;

/// Whether an inode is open on this mount (an unlinked open inode becomes an orphan).
pub type IsOpen = std::sync::Arc<dyn Fn(u64) -> bool + Send + Sync>;

/// Gives the (inode, atime) pairs an atime change commits, when it runs (so that accesses
/// made while it waited in the queue ride along).
pub type AtimeTake = Box<dyn FnMut() -> Vec<(u64, i64)> + Send>;

/// The root directory's inode number (FUSE's root nodeid).
pub const ROOT_INO: u64 = 1;

/// Inodes, each with the names of its xattrs (`MetaStore::xattr_names_of`).
pub type InodesXattrNames = Vec<(u64, Vec<Vec<u8>>)>;

/// One inode's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InodeRec {
    pub ino: u64,
    /// Type and permission bits, as st_mode.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// For a directory, the directory holding it (`..`); the root's is itself.
    pub parent: u64,
}

impl InodeRec {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

/// A name's inode (ENOENT: none) and the session other than the caller's holding a live
/// lease on its directory (`MetaStore::lookup_and_foreign_lease`).
pub type NameAndLease = (Result<InodeRec, Errno>, Option<u64>);
/// A directory's names, each with the inode it holds.
pub type NamesIn = std::collections::HashMap<Vec<u8>, u64>;

/// A setxattr's terms.
#[derive(Debug, Clone)]
pub struct XattrSet {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// XATTR_CREATE, XATTR_REPLACE.
    pub flags: u32,
    /// Setting an access ACL also clears the set-group-ID bit (see `ops::setxattr`).
    pub kill_sgid: bool,
}

/// A new inode and its name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewNode {
    /// The inode number, when the caller chose it from a range the store delegated to it
    /// (`MetaStore::delegate_inodes`); None: the store picks one.
    pub ino: Option<u64>,
    pub parent: u64,
    /// Empty for an O_TMPFILE (no name, link count 0, an orphan until linked).
    pub name: Vec<u8>,
    /// With type bits.
    pub mode: u32,
    pub uid: u32,
    /// The caller's group; a set-group-ID parent's group (and, for a directory, the bit)
    /// replaces it when the store creates the inode.
    pub gid: u32,
    pub rdev: u32,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
    pub now_ns: i64,
    /// A directory created early under its parent's lease on a shared volume holds its own
    /// lease from birth: its row (this session, expiring at this wall-clock time) is
    /// written in the create's own transaction, so no other mount can see the directory
    /// before the lease exists.
    pub lease_expires_ns: Option<i64>,
    /// On a shared volume, a create in a directory whose lease this mount does not hold:
    /// the volume clock's time at which another mount's live lease on the directory refuses
    /// the create (`ops::FOREIGN_LEASE`, nothing changed), checked in the statement that
    /// updates the directory's row instead of a read of its own before it.
    pub unleased_at_ns: Option<i64>,
    /// Xattrs the inode is born with (name, value): the POSIX ACLs its directory's default
    /// ACL hands down (`acl::inherit`), inserted in the create's own transaction.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// What `mode` and `xattrs` were made of, when they came from the directory's default
    /// ACL as this mount knew it, which may be older than another mount's change of it:
    /// they are made again from the default ACL under the directory's lease when answered
    /// early (`AsyncDirops::inherited_under`), and from the one its transaction reads when
    /// made outside the lease (`unleased_at_ns`), if it is another.
    pub inherit: Option<Inherit>,
}

/// A new inode's requested mode and the umask, and the default ACL its mode and ACLs were
/// made of (`acl::inherit`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inherit {
    /// With type bits.
    pub mode: u32,
    pub umask: u32,
    pub default: Option<Vec<u8>>,
}

impl NewNode {
    /// The new inode's record, numbered `ino`, in a directory of `parent_mode` and
    /// `parent_gid`: a set-group-ID directory hands down its group, and to directories the
    /// bit. One rule for the store's create and for the answer given before it commits.
    pub fn record(&self, ino: u64, parent_mode: u32, parent_gid: u32) -> InodeRec {
        let dir = self.mode & libc::S_IFMT == libc::S_IFDIR;
        let (mut mode, mut gid) = (self.mode, self.gid);
        if parent_mode & libc::S_ISGID != 0 {
            gid = parent_gid;
            if dir {
                mode |= libc::S_ISGID;
            }
        }
        InodeRec {
            ino,
            mode,
            uid: self.uid,
            gid,
            rdev: self.rdev,
            nlink: if self.name.is_empty() {
                0
            } else if dir {
                2
            } else {
                1
            },
            size: self.target.as_ref().map_or(0, |t| t.len() as u64),
            atime_ns: self.now_ns,
            mtime_ns: self.now_ns,
            ctime_ns: self.now_ns,
            parent: self.parent,
        }
    }
}

/// One chunk of a file: the block holding its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRec {
    pub idx: u64,
    pub block: u64,
    /// Bytes of the block that are file data; past them the chunk reads as zeros.
    pub len: u64,
    /// CRC-32 of the whole block object.
    pub crc: u32,
}

/// Part of a chunk rewritten after its base: [pos, pos + len) of chunk `idx` is the first
/// `len` bytes of `block` (see schema step 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRec {
    pub idx: u64,
    pub pos: u64,
    pub len: u64,
    pub block: u64,
    /// CRC-32 of the whole block object.
    pub crc: u32,
}

/// What an open needs to serve reads: the attributes, the inline bytes, the chunk map and
/// the chunks' slices (by chunk, then in commit order).
#[derive(Debug, Clone, Default)]
pub struct FileRec {
    pub attr: InodeRec,
    pub inline: Option<Vec<u8>>,
    pub chunks: Vec<ChunkRec>,
    pub slices: Vec<SliceRec>,
    /// The names of its xattrs that a caller can list or get (not the row of its `chattr`
    /// flags), read with the rest; None where not read.
    pub xattr_names: Option<Vec<Vec<u8>>>,
}

/// One directory entry as a listing sees it.
#[derive(Debug, Clone)]
pub struct DirItem {
    pub name: Vec<u8>,
    pub ino: u64,
    /// The entry's file type (`d_type`, S_IFMT >> 12).
    pub kind: u32,
    /// None where the inode's row is damaged (`ops::StoredInode::record`).
    pub attr: Option<InodeRec>,
}

/// The outcome of a flush or truncate of a file's data, committed as one change.
#[derive(Debug, Clone, Default)]
pub struct DataUpdate {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// `Some(bytes)`: the file is inline with these bytes (and has no chunks).
    /// `None`: the file has no inline bytes.
    pub inline: Option<Vec<u8>>,
    /// Chunks written (new blocks), replacing any earlier block of the same index and its
    /// slices.
    pub set: Vec<ChunkRec>,
    /// Slices written, each laid over its chunk after the ones it has.
    pub slices: Vec<SliceRec>,
    /// Chunks that became holes (their slices go too).
    pub holes: Vec<u64>,
    /// Chunks (and slices) at or past this index are dropped (truncate).
    pub drop_from: Option<u64>,
    /// A chunk shortened by a truncate: (idx, len); its slices past `len` go, one across it
    /// is shortened.
    pub trim: Option<(u64, u64)>,
    /// The bytes are the same, only stored otherwise (a compaction): size and times stay.
    pub keep_times: bool,
    /// Committed durably, with everything committed before it (an fsync's flush, which so
    /// needs no sync of its own after it).
    pub durable: bool,
}

/// A new small file's bytes, committed after its close returned (`FileState::flush_early`):
/// the file is inline with these bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InlineUpdate {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub bytes: Vec<u8>,
}

impl InlineUpdate {
    pub fn into_data_update(self) -> DataUpdate {
        DataUpdate {
            ino: self.ino,
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            inline: Some(self.bytes),
            ..DataUpdate::default()
        }
    }
}

/// Attribute changes of a SETATTR (sizes go through [`DataUpdate`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
    pub ctime_ns: i64,
}

/// Leftovers of removing a name: the blocks a freed inode no longer needs.
#[derive(Debug, Clone, Default)]
pub struct Removed {
    /// The inode whose name went away.
    pub ino: u64,
    /// Blocks released by freeing the inode (delete them from the store).
    pub released: Vec<u64>,
    /// The inode lost its last name while open: it is an orphan until its last release.
    pub orphaned: bool,
}

/// What a rename did to the names involved.
#[derive(Debug, Clone, Default)]
pub struct Renamed {
    /// An inode whose name was replaced by the rename (not with EXCHANGE).
    pub replaced: Option<Removed>,
}

/// What a change-log row tells the other mounts of a shared volume to forget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The name `name` in `parent` (created, removed, renamed, linked), the directory's
    /// attributes and the inode's.
    Entry = 1,
    /// The inode's attributes and data.
    Inode = 2,
    /// The inode's chattr flags and attributes: the other mounts read its flags again.
    Flags = 3,
}

/// One change-log row.
#[derive(Debug, Clone)]
pub struct ChangeRec {
    pub seq: u64,
    pub ino: u64,
    pub parent: u64,
    pub name: Option<Vec<u8>>,
    pub kind: i64,
}

/// What a heartbeat found.
#[derive(Debug, Default)]
pub struct Beat {
    /// Sessions it ended (their heartbeat had stopped).
    pub ended: Vec<u64>,
    /// Directories whose lease this session holds, renewed by it (a shared volume).
    pub leases: Vec<u64>,
}

/// A change of a directory lease (a shared volume's asynchronous directory operations, see
/// `dirops` and the `leases` table).
#[derive(Debug, Clone, Copy)]
pub enum LeaseChange {
    /// Takes (or renews) the lease on `dir` until `expires_ns`, unless another session holds
    /// it, or it was let go and may not be taken again yet, at `now_ns`. Answers whether
    /// this session holds it now.
    Take {
        dir: u64,
        now_ns: i64,
        expires_ns: i64,
    },
    /// Lets `dir` go; nobody takes it again before `free_from_ns` (None: at once). With a
    /// `free_from_ns` (a let-go at a recall), only while the lease is recalled.
    Release { dir: u64, free_from_ns: Option<i64> },
    /// Asks `holder`, which holds `dir`, to let it go.
    Recall { dir: u64, holder: u64 },
}

/// flock(2) or POSIX record locks: separate on Linux, they never conflict with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Flock = 1,
    Posix = 2,
}

/// Lock types as the kernel sends them (`struct fuse_file_lock`'s type).
pub const LOCK_READ: i64 = libc::F_RDLCK as i64;
pub const LOCK_WRITE: i64 = libc::F_WRLCK as i64;
pub const LOCK_UNLOCK: i64 = libc::F_UNLCK as i64;

/// A lock request of a shared volume: an owner's lock of `typ` on [start, end] (inclusive).
#[derive(Debug, Clone)]
pub struct LockReq {
    pub ino: u64,
    /// The kernel's lock owner (a process's files table for POSIX, an open file for flock);
    /// unique within the mount only, so always paired with the session.
    pub owner: u64,
    pub kind: LockKind,
    pub typ: i64,
    pub start: i64,
    pub end: i64,
    pub pid: u32,
    /// The open (FUSE handle) it came through: an OFD lock's owner is that open, and its
    /// locks go at its RELEASE (see `fs::locks`). Not stored.
    pub fh: u64,
}

/// A lock that stands in a request's way (what F_GETLK reports).
#[derive(Debug, Clone)]
pub struct LockHolder {
    pub typ: i64,
    pub start: i64,
    pub end: i64,
    pub pid: u32,
}

/// Counts for `lanefs status` and statfs.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub inodes: u64,
    pub bytes: u64,
}

/// What waits for the database (see `MetaStore::backlog`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Changes answered before their commit and not finished.
    pub waiting: u64,
    /// A reconnect waited its longest in vain and no connection was made since.
    pub database_gone: bool,
}

/// How the committer has worked so far (`MetaStore::commit_counts`, `lanefs stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitCounts {
    /// Batches run (one transaction each, committed or not).
    pub batches: u64,
    /// Times the writer thread was woken to commit (a caller that commits itself is not
    /// counted): at most one per gathering of changes answered early, plus one per change
    /// someone waits for that found the committer busy.
    pub wakes: u64,
    /// Changes committed per second, as recent batches measured it (0: not yet).
    pub rate: u64,
    /// Changes answered early that found the backlog full and waited for room in it.
    pub room_waits: u64,
    /// Updates of a directory's or a new inode's row a batch sent without waiting for
    /// their answer (`ops::Writer::locked_dirs`, `created_inodes`).
    pub updates_unwaited: u64,
}

pub trait MetaStore: Send + Sync + 'static {
    // Reads, on the caller's thread.
    fn lookup(&self, queue: usize, parent: u64, name: &[u8]) -> Result<InodeRec, Errno>;
    fn getattr(&self, queue: usize, ino: u64) -> Result<InodeRec, Errno>;
    /// The records of those of `inos` that exist, in no particular order, in one read.
    fn getattrs(&self, queue: usize, inos: &[u64]) -> Result<Vec<InodeRec>, Errno>;
    fn readdir(&self, queue: usize, dir: u64) -> Result<Vec<DirItem>, Errno>;
    /// `dir`'s names and their inodes, without attributes, in one read; None when it has
    /// more than `max`.
    fn names_in(&self, queue: usize, dir: u64, max: usize) -> Result<Option<NamesIn>, Errno>;
    fn readlink(&self, queue: usize, ino: u64) -> Result<Vec<u8>, Errno>;
    fn getxattr(&self, queue: usize, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno>;
    /// The names of the inode's xattrs that callers see (not its `chattr` flags' row).
    fn listxattr(&self, queue: usize, ino: u64) -> Result<Vec<Vec<u8>>, Errno>;
    /// `listxattr` of many inodes in one read: those of `inos` whose xattrs are all
    /// committed, each with its names (most have none).
    fn xattr_names_of(&self, queue: usize, inos: &[u64]) -> Result<InodesXattrNames, Errno>;
    fn load_file(&self, queue: usize, ino: u64) -> Result<FileRec, Errno>;
    fn usage(&self) -> Result<Usage, Errno>;

    // Changes, each one transaction (shared with others: group commit).
    /// mknod, mkdir, symlink and create: EEXIST when the name is taken.
    fn create(&self, node: NewNode, done: Done<InodeRec>);
    /// A new name for an existing non-directory inode. `unleased_at_ns`, as
    /// `NewNode::unleased_at_ns`: another mount's live lease on `parent` then refuses it
    /// with `ops::FOREIGN_LEASE`, changing nothing.
    fn link(
        &self,
        ino: u64,
        parent: u64,
        name: Vec<u8>,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        done: Done<InodeRec>,
    );
    /// unlink (`dir` false) or rmdir (`dir` true). `unleased_at_ns`, as
    /// `NewNode::unleased_at_ns`: another mount's live lease on `parent` (or on the
    /// directory an rmdir removes) then refuses it with `ops::FOREIGN_LEASE`, changing
    /// nothing.
    #[allow(clippy::too_many_arguments)]
    fn remove(
        &self,
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Removed>,
    );
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        parent: u64,
        name: Vec<u8>,
        newparent: u64,
        newname: Vec<u8>,
        flags: u32,
        now_ns: i64,
        unleased_at_ns: Option<i64>,
        is_open: IsOpen,
        done: Done<Renamed>,
    );
    /// `unleased_at_ns`, as `NewNode::unleased_at_ns`, for a directory's own attributes or
    /// xattrs (its group, set-group-ID bit and default ACL are what the files created in it
    /// inherit, answered early under its lease): another mount's live lease on `ino` then
    /// refuses the change with `ops::FOREIGN_LEASE`, changing nothing.
    fn setattr(
        &self,
        ino: u64,
        change: AttrChange,
        unleased_at_ns: Option<i64>,
        done: Done<InodeRec>,
    );
    /// A file's data changed (flush, truncate); the blocks it refers to are durable already.
    fn update_data(&self, update: DataUpdate, done: Done<Vec<u64>>);
    /// XATTR_CREATE / XATTR_REPLACE in `flags`. `unleased_at_ns`: as `setattr`'s.
    fn setxattr(&self, ino: u64, set: XattrSet, unleased_at_ns: Option<i64>, done: Done<()>);
    /// `unleased_at_ns`: as `setattr`'s.
    fn removexattr(&self, ino: u64, name: Vec<u8>, unleased_at_ns: Option<i64>, done: Done<()>);
    /// Frees an orphan at its last release; its released blocks.
    fn free_orphan(&self, ino: u64, done: Done<Vec<u64>>);
    /// Everything committed before is durable when `done` runs (fsyncdir, syncfs).
    fn sync(&self, done: Done<()>);

    // Asynchronous directory operations (issue 15, see `dirops`): changes answered before
    // they commit, and what they need from the store.
    /// A create that nobody waits for (`node.ino` delegated): queued for the committer's own
    /// thread, never committed on the caller's, so that it joins a batch.
    fn create_in_background(&self, node: NewNode, done: Done<InodeRec>);
    /// A remove that nobody waits for, queued as `create_in_background` is.
    fn remove_in_background(
        &self,
        parent: u64,
        name: Vec<u8>,
        dir: bool,
        now_ns: i64,
        is_open: IsOpen,
        done: Done<Removed>,
    );
    /// A new small file's inline bytes that nobody waits for, queued as
    /// `create_in_background` is.
    fn update_data_in_background(&self, update: InlineUpdate, done: Done<Vec<u64>>);
    /// An attribute change of an inode created here and not committed yet, that nobody
    /// waits for, queued as `create_in_background` is.
    fn setattr_in_background(&self, ino: u64, change: AttrChange, done: Done<InodeRec>);
    /// Runs once every change queued before it has committed or failed (no sync).
    fn barrier(&self, done: Done<()>);
    /// Whether a change may be answered before its commit now: fewer than the mount's
    /// `async_backlog` changes wait answered for theirs, the intent log has room, and the
    /// database was not found gone: Some(true). Some(false): changes wait for their commit
    /// (so a database that is slow or gone holds back a bounded amount, in memory and in
    /// the log). With the backlog full on a database that commits, it waits for room
    /// (`wait`; at most a second) or answers None at once (not `wait`).
    fn backlog_has_room(&self, wait: bool) -> Option<bool>;
    /// What waits for the database now (`lanefs stats`).
    fn backlog(&self) -> Backlog;
    /// The committer's batches and wakes so far (`lanefs stats`).
    fn commit_counts(&self) -> CommitCounts;
    /// A range of inode numbers [start, end) for the caller to hand out itself; crash
    /// recovery drops the session's ranges, and the counter never goes back, so a number
    /// is never used twice. Committed by the committer's own thread.
    fn delegate_inodes(&self, done: Done<(u64, u64)>);
    /// The blocks were deleted from the block store: forget them.
    fn forget_blocks(&self, blocks: Vec<u64>, done: Done<()>);
    /// Blocks in [lo, hi) that chunks or slices refer to (what a crashed session's writes left in use).
    fn blocks_between(&self, lo: u64, hi: u64) -> Result<Vec<u64>, Errno>;
    /// Sessions that ended without unmounting (found when this one started).
    fn crashed_sessions(&self) -> Vec<u64>;
    /// Blocks waiting for deletion (released by a commit, not yet deleted from the store).
    fn pending_gc(&self) -> Result<Vec<u64>, Errno>;
    /// Now by the clock that heartbeats and leases are timed by (`store::VolumeClock`: on a
    /// shared volume the database server's, never this machine's wall clock).
    fn volume_now_ns(&self) -> i64;
    /// The session's heartbeat at `now_ns` (volume time); on a shared volume it also renews
    /// the session's directory leases (until `now_ns` + `ops::LEASE_TTL`) and ends sessions
    /// whose heartbeat stopped, and answers which (their uncommitted blocks are the caller's
    /// to delete).
    fn heartbeat(&self, now_ns: i64, done: Done<Beat>);
    /// Ends the session (unmount): removes its row and ranges; the committer stops after it.
    fn close(&self);

    // Access times and file attributes (issue 17).
    /// Sets inodes' atimes alone (reads or listings moved them; ctime stays) in one change
    /// queued for the committer's thread: nothing waits for it but `done`, which gets the
    /// pairs committed. An inode gone by then is skipped.
    fn touch_atimes(&self, take: AtimeTake, done: Done<Vec<(u64, i64)>>);
    /// Every inode with file-attribute flags (chattr's), and its flags.
    fn fileattr_flags(&self) -> Result<Vec<(u64, u32)>, Errno>;
    /// Sets an inode's file-attribute flags (none: 0) and its ctime, in one change; without
    /// `may_guard` (CAP_LINUX_IMMUTABLE), EPERM if that would change immutable or
    /// append-only as the store holds them (another mount may have set them meanwhile).
    fn set_fileattr_flags(
        &self,
        ino: u64,
        flags: u32,
        may_guard: bool,
        ctime_ns: i64,
        done: Done<()>,
    );

    // Locks of a shared volume (issue 14); a volume one mount holds leaves them to the kernel.
    /// The lock of another owner that conflicts with `req`, if any (F_GETLK).
    fn lock_conflict(&self, queue: usize, req: &LockReq) -> Result<Option<LockHolder>, Errno>;
    /// Takes, changes or drops a lock (F_SETLK); the conflicting lock when another owner
    /// holds one (nothing changed then).
    fn set_lock(&self, req: LockReq, done: Done<Option<LockHolder>>);
    /// Drops this mount's locks on `ino`: one owner's of one kind, or all (None).
    fn release_locks(&self, ino: u64, owner: Option<(u64, LockKind)>, done: Done<()>);

    // Files unlinked on one mount of a shared volume while open on another (issue 14).
    /// This mount has `ino` open and saw it unlinked elsewhere: holds it if it is an orphan;
    /// whether it holds it.
    fn hold_orphan(&self, ino: u64, done: Done<bool>);
    /// The last close here of an orphan this mount held.
    fn release_hold(&self, ino: u64, done: Done<()>);
    /// Frees this session's orphans unlinked before `before_ns` that no mount holds and that
    /// are not open here; the blocks released.
    fn sweep_orphans(&self, before_ns: i64, is_open: IsOpen, done: Done<Vec<u64>>);

    // Directory leases of a shared volume (issue 15); none where one mount holds the volume.
    /// The session holding a live lease on `dir` other than this one, if any.
    fn foreign_lease(&self, queue: usize, dir: u64, now_ns: i64) -> Result<Option<u64>, Errno>;
    /// `lookup` and `foreign_lease(parent)` in one read (one round trip): the name's inode
    /// (ENOENT: none), and the session other than this one holding a live lease on `parent`.
    fn lookup_and_foreign_lease(
        &self,
        queue: usize,
        parent: u64,
        name: &[u8],
        now_ns: i64,
    ) -> Result<NameAndLease, Errno>;
    /// Directories whose lease this session holds and another mount recalled.
    fn recalled_leases(&self) -> Result<Vec<u64>, Errno>;
    /// Takes, lets go or recalls a lease; committed by the committer's own thread (never on
    /// the caller's), in the order queued.
    fn change_lease(&self, change: LeaseChange, done: Done<bool>);

    // A shared volume's change log (issue 14).
    /// What other sessions changed past `cursors` (session → last seq read; moved on by the
    /// call). Empty on a volume that one mount holds.
    fn changes_since(
        &self,
        cursors: &mut std::collections::HashMap<u64, u64>,
    ) -> Result<Vec<ChangeRec>, Errno>;
}

/// Where an inode's file-attribute flags (FS_*_FL) are kept: a row of its xattrs under this
/// name, outside every namespace a caller can reach (the file system hides it), as 4 bytes,
/// little-endian. An xattr row rather than an inode column, so a volume of format 1 carries
/// them with no migration, and dump/load and fsck keep them.
pub const FILEATTR_XATTR: &[u8] = b"lanefs.fileattr";

/// Waits for a change's outcome on the calling thread (for callers with nothing else to do).
pub fn wait<T: Send + 'static>(submit: impl FnOnce(Done<T>)) -> Result<T, Errno> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    submit(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv().unwrap_or(Err(libc::EIO))
}
