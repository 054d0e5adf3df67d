//! A bounded cache of O_PATH fds reopened from file handles, so that known inodes cost no fd
//! (the open-file limit here is 20,000 and cannot be raised; a kernel tree has 84,000
//! entries) while the inodes in use cost no reopen.
//!
//! Sharded by nodeid. Each shard is a CLOCK: a ring of at most `per_shard` slots with a hand,
//! and a map from nodeid to slot. A hit takes the shard's read lock and sets the slot's
//! `referenced` bit (only if clear: a hot entry's cache line is not written on every hit); a
//! miss opens outside any lock and inserts under the write lock into a free slot, or, when the
//! shard is full, at the hand: the hand passes over referenced slots, clearing their bit, and
//! evicts the first slot whose bit is clear, then stays past it. Each slot's bit is cleared at
//! most once per set, so a miss costs O(1) slots examined, amortized.
//! Entries are `Arc`s: an evicted fd stays open until the request using it finishes.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::counters::PerThreadCounter;
use super::inode::IdHasher;
use super::sys::SysResult;

const SHARDS_MAX: usize = 16;

struct Slot {
    nodeid: u64,
    fd: Arc<OwnedFd>,
    referenced: AtomicBool,
}

#[derive(Default)]
struct Clock {
    /// nodeid → index in `slots`.
    index: HashMap<u64, usize, IdHasher>,
    /// The ring; None where a forgotten inode's fd was dropped (listed in `free`).
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    hand: usize,
}

struct Shard {
    /// One shard's CLOCK. Lock order: a leaf (no other lock is taken while holding it).
    clock: RwLock<Clock>,
    evictions: AtomicU64,
    /// Slots the hand examined (to check the cost per miss).
    swept: AtomicU64,
}

pub struct FdCache {
    shards: Box<[Shard]>,
    per_shard: usize,
    /// Per thread, not per shard: a hot inode's hits would make every queue write its
    /// shard's counter line.
    hits: PerThreadCounter,
    misses: PerThreadCounter,
}

/// Totals for `lanefs stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct FdCacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub cached: u64,
    pub swept: u64,
}

impl FdCache {
    /// A cache of at most `capacity` fds (0: every use reopens).
    pub fn new(capacity: usize) -> FdCache {
        let shards = capacity.clamp(1, SHARDS_MAX);
        FdCache {
            shards: (0..shards)
                .map(|_| Shard {
                    clock: RwLock::default(),
                    evictions: AtomicU64::new(0),
                    swept: AtomicU64::new(0),
                })
                .collect(),
            per_shard: capacity / shards,
            hits: PerThreadCounter::default(),
            misses: PerThreadCounter::default(),
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
            let clock = shard.clock.read().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = clock.slot(nodeid) {
                if !slot.referenced.load(Ordering::Relaxed) {
                    slot.referenced.store(true, Ordering::Relaxed);
                }
                self.hits.bump();
                return Ok(slot.fd.clone());
            }
        }
        self.misses.bump();
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
        let mut clock = shard.clock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = clock.slot(nodeid) {
            // A lookup of an inode already cached: keep its fd, and count it as a use
            // rather than make it the next victim.
            known.referenced.store(true, Ordering::Relaxed);
            return;
        }
        let slot = Slot {
            nodeid,
            fd,
            referenced: AtomicBool::new(false),
        };
        let at = if let Some(free) = clock.free.pop() {
            free
        } else if clock.slots.len() < self.per_shard {
            clock.slots.push(None);
            clock.slots.len() - 1
        } else {
            let (victim, swept) = clock.sweep();
            shard.swept.fetch_add(swept, Ordering::Relaxed);
            shard.evictions.fetch_add(1, Ordering::Relaxed);
            victim
        };
        clock.index.insert(nodeid, at);
        clock.slots[at] = Some(slot);
    }

    /// Drops the fd of a forgotten inode (so a deleted file's space is freed).
    pub fn remove(&self, nodeid: u64) {
        let shard = self.shard(nodeid);
        let mut clock = shard.clock.write().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = clock.index.remove(&nodeid) {
            clock.slots[at] = None;
            clock.free.push(at);
        }
    }

    pub fn counts(&self) -> FdCacheCounts {
        let mut c = FdCacheCounts {
            hits: self.hits.get(),
            misses: self.misses.get(),
            ..Default::default()
        };
        for shard in self.shards.iter() {
            c.evictions += shard.evictions.load(Ordering::Relaxed);
            c.swept += shard.swept.load(Ordering::Relaxed);
            c.cached += shard
                .clock
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .index
                .len() as u64;
        }
        c
    }
}

impl Clock {
    fn slot(&self, nodeid: u64) -> Option<&Slot> {
        self.index
            .get(&nodeid)
            .and_then(|&at| self.slots.get(at))
            .and_then(Option::as_ref)
    }

    /// Evicts at the hand (the ring is full, no slot free): passes over referenced slots,
    /// clearing their bit, and frees the first clear one. Returns its index and how many
    /// slots were examined (at most one turn and one slot: after a turn every bit is clear).
    fn sweep(&mut self) -> (usize, u64) {
        let len = self.slots.len();
        let mut swept = 0;
        loop {
            let at = self.hand;
            self.hand = (self.hand + 1) % len;
            swept += 1;
            // Every slot holds an entry here (a freed one would be in `free`, which is empty).
            let referenced = self.slots[at]
                .as_ref()
                .is_some_and(|slot| slot.referenced.swap(false, Ordering::Relaxed));
            if !referenced {
                if let Some(old) = self.slots[at].take() {
                    self.index.remove(&old.nodeid);
                }
                return (at, swept);
            }
        }
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

    /// Ids that land in shard 0 of a cache with 16 shards.
    fn in_shard0(n: u64) -> u64 {
        n * 16
    }

    #[test]
    fn referenced_entries_get_a_second_chance() {
        // 16 shards of 8.
        let cache = FdCache::new(128);
        for n in 0..8 {
            cache.get_or_open(in_shard0(n), devnull).unwrap();
        }
        // Entries 0..4 are used again; 4 newcomers evict the four unused ones.
        for n in 0..4 {
            cache
                .get_or_open(in_shard0(n), || panic!("cached"))
                .unwrap();
        }
        for n in 8..12 {
            cache.get_or_open(in_shard0(n), devnull).unwrap();
        }
        for n in 0..4 {
            cache
                .get_or_open(in_shard0(n), || panic!("{n} was evicted"))
                .unwrap();
        }
        for n in 4..8 {
            let mut reopened = false;
            cache
                .get_or_open(in_shard0(n), || {
                    reopened = true;
                    devnull()
                })
                .unwrap();
            assert!(reopened, "{n} should have been evicted");
        }
    }

    #[test]
    fn a_miss_examines_few_slots_while_a_hot_set_keeps_being_hit() {
        // One shard of 1024 (capacity 16 * 1024 spread over 16 shards; only shard 0 used).
        let cache = FdCache::new(16 * 1024);
        let hot = 512;
        for n in 0..1024 {
            cache.get_or_open(in_shard0(n), devnull).unwrap();
        }
        let misses = 5_000;
        for i in 0..misses {
            for n in 0..hot {
                cache.get_or_open(in_shard0(n), devnull).unwrap();
            }
            cache.get_or_open(in_shard0(10_000 + i), devnull).unwrap();
        }
        let c = cache.counts();
        // A rescan from the start over the referenced hot set would examine ~`hot` slots
        // per miss; the hand passes each set bit once.
        assert!(
            c.swept <= 4 * c.evictions,
            "{} slots examined for {} evictions",
            c.swept,
            c.evictions
        );
    }

    #[test]
    fn forgotten_slots_are_reused() {
        let cache = FdCache::new(16);
        cache.get_or_open(0, devnull).unwrap();
        cache.remove(0);
        cache.get_or_open(16, devnull).unwrap();
        let c = cache.counts();
        assert_eq!((c.cached, c.evictions), (1, 0));
    }
}
