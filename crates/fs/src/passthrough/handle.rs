//! Open files and directories, by the `fh` the kernel hands back: a sharded table whose
//! entries are `Arc`s, so a request keeps its file alive even if RELEASE races with it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::dir::DirStream;
use super::inode::{IdHasher, Inode};

const SHARDS: usize = 32;

/// An open regular file (or other non-directory).
pub struct OpenFile {
    /// The host fd of this open: reads, writes, fsync, flock and ops on an unlinked file all
    /// use it, never a path.
    pub fd: OwnedFd,
    pub inode: Arc<Inode>,
    /// The open(2) flags the client used (access mode, O_APPEND, ...).
    pub flags: i32,
    /// Answered FOPEN_PASSTHROUGH: its share of the inode's backing id is released on close.
    pub passthrough: bool,
    /// Answered page-cache I/O (counted in the inode's OpenState).
    pub cached: bool,
}

impl OpenFile {
    pub fn writable(&self) -> bool {
        self.flags & libc::O_ACCMODE != libc::O_RDONLY
    }
}

/// An open directory: its fd and where its listing stands.
pub struct OpenDir {
    pub inode: Arc<Inode>,
    /// Lock order: a leaf; held for one READDIR of this handle (the kernel sends them one at
    /// a time per open directory anyway).
    pub stream: Mutex<DirStream>,
}

type Shard<T> = RwLock<HashMap<u64, Arc<T>, IdHasher>>;

pub struct HandleTable<T> {
    /// fh → open object. Lock order: a leaf.
    shards: Box<[Shard<T>]>,
    next: AtomicU64,
}

impl<T> HandleTable<T> {
    pub fn new() -> Self {
        HandleTable {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            next: AtomicU64::new(1),
        }
    }

    fn shard(&self, fh: u64) -> &Shard<T> {
        &self.shards[fh as usize % SHARDS]
    }

    pub fn insert(&self, value: T) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(value));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.shard(fh)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.shard(fh)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh)
    }
}
