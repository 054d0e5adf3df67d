//! A bounded cache of O_PATH fds reopened from file handles, so that known inodes cost no fd
//! (the open-file limit here is 20,000 and cannot be raised; a kernel tree has 84,000
//! entries) while the inodes in use cost no reopen.
//!
//! Sharded by nodeid. A hit takes its shard's read lock and sets the entry's `referenced`
//! bit; a miss opens outside any lock and inserts under the write lock, evicting by CLOCK
//! (the first entry whose bit is clear, clearing bits on the way) when the shard is full.
//! Entries are `Arc`s: an evicted fd stays open until the request using it finishes.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::inode::IdHasher;
use super::sys::SysResult;

const SHARDS_MAX: usize = 16;

struct Entry {
    fd: Arc<OwnedFd>,
    referenced: AtomicBool,
}

struct Shard {
    /// nodeid → its O_PATH fd. Lock order: a leaf (no other lock is taken while holding it).
    map: RwLock<HashMap<u64, Entry, IdHasher>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

pub struct FdCache {
    shards: Box<[Shard]>,
    per_shard: usize,
}

/// Totals for `lanefs stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct FdCacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub cached: u64,
}

impl FdCache {
    /// A cache of at most `capacity` fds (0: every use reopens).
    pub fn new(capacity: usize) -> FdCache {
        let shards = capacity.clamp(1, SHARDS_MAX);
        FdCache {
            shards: (0..shards)
                .map(|_| Shard {
                    map: RwLock::new(HashMap::default()),
                    hits: AtomicU64::new(0),
                    misses: AtomicU64::new(0),
                    evictions: AtomicU64::new(0),
                })
                .collect(),
            per_shard: capacity / shards,
        }
    }

    fn shard(&self, nodeid: u64) -> &Shard {
        &self.shards[(nodeid as usize) % self.shards.len()]
    }

    /// The cached fd of `nodeid`, or a new one from `open`, cached if there is room.
    pub fn get_or_open(
        &self,
        nodeid: u64,
        open: impl FnOnce() -> SysResult<OwnedFd>,
    ) -> SysResult<Arc<OwnedFd>> {
        let shard = self.shard(nodeid);
        {
            let map = shard.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = map.get(&nodeid) {
                entry.referenced.store(true, Ordering::Relaxed);
                shard.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(entry.fd.clone());
            }
        }
        shard.misses.fetch_add(1, Ordering::Relaxed);
        let fd = Arc::new(open()?);
        self.insert(nodeid, fd.clone());
        Ok(fd)
    }

    /// Caches `fd` as the O_PATH fd of `nodeid` (a lookup that just opened it).
    pub fn insert(&self, nodeid: u64, fd: Arc<OwnedFd>) {
        if self.per_shard == 0 {
            return;
        }
        let shard = self.shard(nodeid);
        let mut map = shard.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = map.get(&nodeid) {
            // A lookup of an inode already cached: keep its fd, and count it as a use
            // rather than make it the next victim.
            known.referenced.store(true, Ordering::Relaxed);
            return;
        }
        if map.len() >= self.per_shard {
            let victim = map
                .iter()
                .find(|(_, e)| !e.referenced.swap(false, Ordering::Relaxed))
                .or_else(|| map.iter().next())
                .map(|(id, _)| *id);
            if let Some(victim) = victim {
                map.remove(&victim);
                shard.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        map.insert(
            nodeid,
            Entry {
                fd,
                referenced: AtomicBool::new(false),
            },
        );
    }

    /// Drops the fd of a forgotten inode (so a deleted file's space is freed).
    pub fn remove(&self, nodeid: u64) {
        let shard = self.shard(nodeid);
        shard
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nodeid);
    }

    pub fn counts(&self) -> FdCacheCounts {
        let mut c = FdCacheCounts::default();
        for shard in self.shards.iter() {
            c.hits += shard.hits.load(Ordering::Relaxed);
            c.misses += shard.misses.load(Ordering::Relaxed);
            c.evictions += shard.evictions.load(Ordering::Relaxed);
            c.cached += shard.map.read().unwrap_or_else(|e| e.into_inner()).len() as u64;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> SysResult<OwnedFd> {
        Ok(std::fs::File::open("/dev/null").unwrap().into())
    }

    #[test]
    fn bounded_with_hits_misses_and_evictions() {
        let cache = FdCache::new(4);
        for id in 0..4 {
            cache.get_or_open(id, devnull).unwrap();
        }
        cache.get_or_open(0, || panic!("cached")).unwrap();
        for id in 4..100 {
            cache.get_or_open(id, devnull).unwrap();
        }
        let c = cache.counts();
        assert!(c.cached <= 4, "{c:?}");
        assert_eq!(c.hits, 1);
        assert_eq!(c.misses, 100);
        assert!(c.evictions >= 96);
        cache.remove(99);
        assert!(cache.counts().cached <= 3);
    }

    #[test]
    fn zero_capacity_never_caches() {
        let cache = FdCache::new(0);
        cache.get_or_open(1, devnull).unwrap();
        cache.get_or_open(1, devnull).unwrap();
        assert_eq!(cache.counts().misses, 2);
        assert_eq!(cache.counts().cached, 0);
    }
}
