//! The inode table: every host inode the kernel knows, keyed by (device, inode number) so
//! that hard links share one entry, and by the nodeid the kernel uses. Entries live exactly
//! as long as the kernel's lookup count (FORGET removes them), so memory stays bounded when
//! a client walks millions of files.
//!
//! An inode holds no fd of its own when the host supports file handles: it keeps the handle
//! (name_to_handle_at) and reopens through the fd cache.

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::gate::WriteGate;
use super::sys::FileHandle;

const SHARDS: usize = 64;

/// A multiplicative hash for integer keys (nodeids, inode numbers): SipHash's resistance to
/// chosen keys buys nothing for numbers the kernel and the host pick.
#[derive(Default, Clone, Copy)]
pub struct IdHash(u64);

impl Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub type IdHasher = BuildHasherDefault<IdHash>;

/// Which host inode: its device and inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub dev: u64,
    pub ino: u64,
}

/// How we reach the host inode again.
pub enum HostRef {
    /// Its file handle, reopened on demand through the fd cache; `mount` is an fd (not
    /// O_PATH) of any object on the same host mount (open_by_handle_at's mount_fd).
    Handle {
        handle: FileHandle,
        mount: Arc<OwnedFd>,
    },
    /// An O_PATH fd held for the inode's lifetime: the host fs has no file handles, or the
    /// inode is an unnamed O_TMPFILE (its handle could not be reopened).
    Fd(Arc<OwnedFd>),
}

/// The passthrough opens of an inode share one backing id (the kernel requires it).
#[derive(Debug, Clone, Copy)]
pub struct Backing {
    pub id: i32,
    /// Opens carrying the id (FOPEN_PASSTHROUGH, with or without DIRECT_IO).
    pub opens: u32,
    /// Those of them open for writing: the kernel may write the host file through a shared
    /// mapping of theirs without telling us (see `PassthroughFs::attr_out`).
    pub writers: u32,
    /// Registered with CAP_FSETID (by a root open): writes through it keep set-ID bits, as
    /// root's do natively. Without it the host strips them, as for any other writer.
    pub keeps_set_id: bool,
}

/// How the open files of an inode reach its data. The kernel refuses to mix page-cache and
/// passthrough opens of one inode, and once it has a backing id every open must carry it.
#[derive(Debug, Default)]
pub struct OpenState {
    /// Open files of this inode, of any kind.
    pub opens: u32,
    /// Opens answered for page-cache I/O.
    pub cached: u32,
    pub backing: Option<Backing>,
}

/// The last name a symlink was seen under: the only way to reach a symlink itself for
/// xattrs (its O_PATH fd, through /proc, would lead to its target).
pub struct LinkName {
    pub parent: Arc<Inode>,
    pub name: CString,
}

pub struct Inode {
    pub nodeid: u64,
    pub key: InodeKey,
    /// Which host device the kernel is shown this inode's number from (see [`DeviceTags`]).
    pub dev_tag: u16,
    /// The file type bits (S_IFMT) of st_mode.
    pub kind: u32,
    /// The host mount id (name_to_handle_at), to tell when a child is on another mount.
    pub mount_id: i32,
    pub host: HostRef,
    /// The kernel's lookup count; changed only under the inode's `by_key` shard lock.
    lookups: AtomicU64,
    pub gate: WriteGate,
    /// Lock order: after nothing; taken on open and release (and by getattr of a set-ID file
    /// with passthrough opens), never with another inode's.
    open_state: Mutex<OpenState>,
    /// `Backing::writers` as one word, stored under `open_state` whenever it changes, so that
    /// every getattr can ask "open for writing through passthrough?" without the lock.
    pub passthrough_writers: AtomicU32,
    /// Symlinks only. Lock order: a leaf.
    link_name: Mutex<Option<LinkName>>,
    /// Until when (nanoseconds on the file system's clock, `PassthroughFs::now_ns`) the
    /// host is known to hold no security.capability for this inode; 0: not known.
    pub caps_absent_until: AtomicU64,
    /// Bumped by each setxattr of security.capability through us, so that a "none" read
    /// from the host before it is not remembered after it.
    pub caps_changes: AtomicU64,
    /// The set-ID and group-execute bits of the mode last seen on the host (low 16 bits)
    /// and when (milliseconds since `EPOCH` plus one, above them; 0: never), so that a write
    /// by a caller without CAP_FSETID need not fstat a file known to have no set-ID bits.
    set_id_seen: AtomicU64,
    /// Bumped before we change the mode (chmod, chown, ACLs, stripping set-ID bits): a stat
    /// taken before the change must not be recorded after it (as the kernel's attr_version).
    mode_changes: AtomicU64,
}

/// The mode bits `set_id_seen` keeps.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID | libc::S_IXGRP;

/// How old (milliseconds) a record of the same set-ID bits must be before a new sighting
/// rewrites it.
const SET_ID_RESTAMP_MS: u64 = 50;

/// The origin of `set_id_seen`'s clock.
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn millis_since_epoch() -> u64 {
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

impl Inode {
    pub fn new(
        nodeid: u64,
        key: InodeKey,
        dev_tag: u16,
        kind: u32,
        mount_id: i32,
        host: HostRef,
        size: u64,
    ) -> Inode {
        Inode {
            nodeid,
            key,
            dev_tag,
            kind,
            mount_id,
            host,
            lookups: AtomicU64::new(1),
            gate: WriteGate::new(size),
            open_state: Mutex::new(OpenState::default()),
            link_name: Mutex::new(None),
            passthrough_writers: AtomicU32::new(0),
            caps_absent_until: AtomicU64::new(0),
            caps_changes: AtomicU64::new(0),
            set_id_seen: AtomicU64::new(0),
            mode_changes: AtomicU64::new(0),
        }
    }

    /// The count of our mode changes, read before a stat whose mode `saw_mode` records.
    pub fn mode_generation(&self) -> u64 {
        self.mode_changes.load(Ordering::SeqCst)
    }

    /// Records the mode of a stat taken when the mode generation was `generation`; dropped
    /// (or undone) if we changed the mode since.
    pub fn saw_mode(&self, mode: u32, generation: u64) {
        if self.mode_changes.load(Ordering::SeqCst) != generation {
            return;
        }
        let now = millis_since_epoch() + 1;
        let bits = (mode & SET_ID_BITS) as u64;
        let seen = self.set_id_seen.load(Ordering::Relaxed);
        // The same bits, recorded a moment ago: leave the line alone (every getattr of a hot
        // file comes here). The record is then up to `SET_ID_RESTAMP_MS` older than this
        // sighting, which only makes `known_without_set_id` trust it for less long.
        // (Another thread may have recorded a later time since our clock read: saturating.)
        if seen & 0xffff == bits
            && seen >> 16 != 0
            && now.saturating_sub(seen >> 16) < SET_ID_RESTAMP_MS
        {
            return;
        }
        self.set_id_seen.store(now << 16 | bits, Ordering::SeqCst);
        // A change that began meanwhile may have cleared the record before ours landed.
        if self.mode_changes.load(Ordering::SeqCst) != generation {
            self.set_id_seen.store(0, Ordering::SeqCst);
        }
    }

    /// Forgets the mode seen: we are about to change it (or just did), so the next write
    /// looks again.
    pub fn forget_mode(&self) {
        self.mode_changes.fetch_add(1, Ordering::SeqCst);
        self.set_id_seen.store(0, Ordering::SeqCst);
    }

    /// Whether the host's mode had no set-ID bits when last seen, at most `max_age` ago.
    /// The same staleness the kernel accepts for its own cached mode (the attribute
    /// timeout); a zero `max_age` never trusts it.
    pub fn known_without_set_id(&self, max_age: std::time::Duration) -> bool {
        let stamp = self.set_id_seen.load(Ordering::Relaxed);
        let seen_at = stamp >> 16;
        seen_at != 0
            && (stamp as u32) & (libc::S_ISUID | libc::S_ISGID) == 0
            && millis_since_epoch() + 1 - seen_at < max_age.as_millis() as u64
    }

    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }

    pub fn is_regular(&self) -> bool {
        self.kind == libc::S_IFREG
    }

    /// An fd (not O_PATH: open_by_handle_at refuses those) on the inode's host mount, when
    /// the inode is known by handle.
    pub fn mount_fd(&self) -> Option<&Arc<OwnedFd>> {
        match &self.host {
            HostRef::Handle { mount, .. } => Some(mount),
            HostRef::Fd(_) => None,
        }
    }

    /// Records the name a symlink was just seen under.
    pub fn set_link_name(&self, parent: Arc<Inode>, name: CString) {
        *self.link_name.lock().unwrap_or_else(|e| e.into_inner()) = Some(LinkName { parent, name });
    }

    /// The parent and name a symlink was last seen under.
    pub fn link_name(&self) -> Option<(Arc<Inode>, CString)> {
        self.link_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|l| (l.parent.clone(), l.name.clone()))
    }

    pub fn open_state(&self) -> MutexGuard<'_, OpenState> {
        self.open_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn same_host(&self, other: &HostRef) -> bool {
        match (&self.host, other) {
            // A held O_PATH fd keeps the host inode alive, so its number is not reused: a
            // linked O_TMPFILE found by name is the same inode.
            (HostRef::Fd(_), _) => true,
            (HostRef::Handle { handle: a, .. }, HostRef::Handle { handle: b, .. }) => a == b,
            // No handle to compare with: a new object.
            (HostRef::Handle { .. }, HostRef::Fd(_)) => false,
        }
    }
}

/// How many bits of a host inode number the kernel sees unchanged; the bits above carry the
/// device tag.
pub const HOST_INO_BITS: u32 = 48;
const HOST_INO_MASK: u64 = (1 << HOST_INO_BITS) - 1;

/// The inode number the kernel is shown for host inode number `ino` on the device tagged
/// `tag`: SOURCE's own device (tag 0) shows its numbers unchanged; any other device's keep
/// their low `HOST_INO_BITS` bits under the tag. The kernel gives every inode of a FUSE
/// mount the mount's one st_dev and offers FUSE_SUBMOUNTS to virtio-fs only, so without this
/// two files on different host file systems could show the same (st_dev, st_ino) and tar,
/// cp -a and rsync -H would take them for hard links.
pub fn shown_ino(tag: u16, ino: u64) -> u64 {
    if tag == 0 {
        ino
    } else {
        u64::from(tag) << HOST_INO_BITS | (ino & HOST_INO_MASK)
    }
}

/// The device tags: host device number → a small number, 0 for SOURCE's device, handed out
/// in the order devices are met and kept for the life of the mount, so an object shows the
/// same inode number however it is reached. Consulted only where a lookup crosses onto
/// another device than its parent's (a mount point under SOURCE); every other inode takes
/// its parent's tag.
pub struct DeviceTags {
    /// Lock order: a leaf; taken by the lookup of an object on another device than its
    /// parent.
    tags: Mutex<HashMap<u64, u16, IdHasher>>,
    /// A host inode number wider than `HOST_INO_BITS` was met on a device other than
    /// SOURCE's (logged once): shown numbers may then collide.
    wide_warned: std::sync::atomic::AtomicBool,
}

impl DeviceTags {
    pub fn new(source_dev: u64) -> DeviceTags {
        let mut tags = HashMap::default();
        tags.insert(source_dev, 0);
        DeviceTags {
            tags: Mutex::new(tags),
            wide_warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The tag of the host device `dev` of an object found in a directory of tag
    /// `parent_tag` on `parent_dev`.
    pub fn tag_for(&self, dev: u64, ino: u64, parent_dev: u64, parent_tag: u16) -> u16 {
        let tag = if dev == parent_dev {
            parent_tag
        } else {
            let mut tags = self.tags.lock().unwrap_or_else(|e| e.into_inner());
            let next = tags.len();
            *tags.entry(dev).or_insert_with(|| {
                // Past the last tag devices share one (their numbers may then collide).
                u16::try_from(next).unwrap_or(u16::MAX)
            })
        };
        if tag != 0
            && ino & !HOST_INO_MASK != 0
            && !self
                .wide_warned
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                "host inode number {ino:#x} is wider than {HOST_INO_BITS} bits: files on \
                 different host file systems under the source may show the same inode number"
            );
        }
        tag
    }
}

type ByKey = HashMap<InodeKey, Arc<Inode>, IdHasher>;
type ById = HashMap<u64, Arc<Inode>, IdHasher>;

pub struct InodeTable {
    /// (dev, ino) → inode, for lookups. Lock order: a `by_key` shard is taken before a
    /// `by_id` shard, never the other way, and never two of either.
    by_key: Box<[Mutex<ByKey>]>,
    /// nodeid → inode, for every other request. Lock order: after `by_key`.
    by_id: Box<[RwLock<ById>]>,
    next_nodeid: AtomicU64,
    live: AtomicU64,
}

fn shard_of(n: u64) -> usize {
    (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS
}

impl InodeTable {
    pub fn new(root: Inode) -> InodeTable {
        let table = InodeTable {
            by_key: (0..SHARDS).map(|_| Mutex::default()).collect(),
            by_id: (0..SHARDS).map(|_| RwLock::default()).collect(),
            next_nodeid: AtomicU64::new(lanefs_fuse::abi::ROOT_ID + 1),
            live: AtomicU64::new(1),
        };
        let root = Arc::new(root);
        table.key_shard(&root.key).insert(root.key, root.clone());
        table.by_id[shard_of(root.nodeid)]
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(root.nodeid, root);
        table
    }

    fn key_shard(&self, key: &InodeKey) -> MutexGuard<'_, ByKey> {
        self.by_key[shard_of(key.ino ^ key.dev.rotate_left(32))]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The inode the kernel knows for a host object, if any.
    pub fn find(&self, key: &InodeKey) -> Option<Arc<Inode>> {
        self.key_shard(key).get(key).cloned()
    }

    pub fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.by_id[shard_of(nodeid)]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nodeid)
            .cloned()
    }

    /// The kernel learns of `key` once more (lookup, create, readdirplus): the known inode
    /// with its lookup count raised, or a new one built by `make` from a fresh nodeid. A known
    /// inode whose host object differs (the host reused the inode number) is replaced; the
    /// old one stays reachable by nodeid until the kernel forgets it. Returns the inode and
    /// whether it is new.
    pub fn remember(
        &self,
        key: InodeKey,
        host: HostRef,
        make: impl FnOnce(u64, HostRef) -> Inode,
    ) -> (Arc<Inode>, bool) {
        let mut by_key = self.key_shard(&key);
        if let Some(known) = by_key.get(&key)
            && known.same_host(&host)
        {
            known.lookups.fetch_add(1, Ordering::Relaxed);
            return (known.clone(), false);
        }
        let nodeid = self.next_nodeid.fetch_add(1, Ordering::Relaxed);
        let inode = Arc::new(make(nodeid, host));
        by_key.insert(key, inode.clone());
        self.by_id[shard_of(nodeid)]
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(nodeid, inode.clone());
        self.live.fetch_add(1, Ordering::Relaxed);
        (inode, true)
    }

    /// The kernel drops `nlookup` references; at zero the inode leaves the table. Returns
    /// true when it left.
    pub fn forget(&self, nodeid: u64, nlookup: u64) -> bool {
        if nodeid == lanefs_fuse::abi::ROOT_ID {
            return false;
        }
        let Some(inode) = self.get(nodeid) else {
            return false;
        };
        let mut by_key = self.key_shard(&inode.key);
        let before = inode.lookups.load(Ordering::Relaxed);
        let after = before.saturating_sub(nlookup);
        inode.lookups.store(after, Ordering::Relaxed);
        if after > 0 {
            return false;
        }
        if by_key
            .get(&inode.key)
            .is_some_and(|known| Arc::ptr_eq(known, &inode))
        {
            by_key.remove(&inode.key);
        }
        self.by_id[shard_of(nodeid)]
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nodeid);
        self.live.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Inodes the kernel currently knows, the root included.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/dev/null").unwrap().into())
    }

    fn make(key: InodeKey) -> impl FnOnce(u64, HostRef) -> Inode {
        move |id, host| Inode::new(id, key, 0, libc::S_IFREG, 0, host, 0)
    }

    #[test]
    fn each_host_device_keeps_its_own_tag_and_numbers_stay_apart() {
        let tags = DeviceTags::new(100);
        // Inside the source's device: tag 0, numbers unchanged.
        assert_eq!(tags.tag_for(100, 7, 100, 0), 0);
        assert_eq!(shown_ino(0, 7), 7);
        // Crossing onto two other devices, then back onto the source's (a bind mount).
        let (a, b) = (tags.tag_for(200, 7, 100, 0), tags.tag_for(300, 7, 100, 0));
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(tags.tag_for(100, 7, 200, a), 0);
        // Below a crossing the parent's tag is kept; met again, a device keeps its tag.
        assert_eq!(tags.tag_for(200, 8, 200, a), a);
        assert_eq!(tags.tag_for(200, 9, 300, b), a);
        let shown = [shown_ino(0, 7), shown_ino(a, 7), shown_ino(b, 7)];
        assert!(shown[0] != shown[1] && shown[1] != shown[2] && shown[0] != shown[2]);
    }

    #[test]
    fn a_mode_seen_before_our_change_is_not_trusted_after_it() {
        let key = InodeKey { dev: 1, ino: 2 };
        let inode = make(key)(2, HostRef::Fd(fd()));
        let timeout = std::time::Duration::from_secs(60);
        assert!(!inode.known_without_set_id(timeout), "never seen");
        inode.saw_mode(libc::S_IFREG | 0o644, inode.mode_generation());
        assert!(inode.known_without_set_id(timeout));
        assert!(!inode.known_without_set_id(std::time::Duration::ZERO));
        // A stat taken before a chmod, recorded after it, is dropped.
        let before_chmod = inode.mode_generation();
        inode.forget_mode();
        inode.saw_mode(libc::S_IFREG | 0o644, before_chmod);
        assert!(!inode.known_without_set_id(timeout));
        inode.saw_mode(libc::S_IFREG | 0o4755, inode.mode_generation());
        assert!(!inode.known_without_set_id(timeout), "set-user-ID seen");
    }

    #[test]
    fn hard_links_share_and_forget_removes_at_zero() {
        let root_key = InodeKey { dev: 1, ino: 2 };
        let table = InodeTable::new(Inode::new(
            1,
            root_key,
            0,
            libc::S_IFDIR,
            0,
            HostRef::Fd(fd()),
            0,
        ));
        let key = InodeKey { dev: 1, ino: 10 };
        let (a, new_a) = table.remember(key, HostRef::Fd(fd()), make(key));
        let (b, new_b) = table.remember(key, HostRef::Fd(fd()), make(key));
        assert!(new_a && !new_b);
        assert_eq!(a.nodeid, b.nodeid);
        assert_eq!(table.live(), 2);
        assert!(!table.forget(a.nodeid, 1));
        assert!(table.get(a.nodeid).is_some());
        assert!(table.forget(a.nodeid, 1));
        assert!(table.get(a.nodeid).is_none());
        assert_eq!(table.live(), 1);
        assert!(!table.forget(1, 100), "the root is never forgotten");
    }
}
