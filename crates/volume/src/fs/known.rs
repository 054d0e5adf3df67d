//! What this mount knows of inodes without asking the store: directories' default ACLs
//! (`DefaultAcls`), inodes' xattr names (`XattrNames`) and open files without set-ID bits
//! or capability (`NoPrivileges`). Each fact is forgotten when this
//! mount changes it (once the change is made), when the change log shows that another mount
//! changed the inode (within its poll interval, the staleness bound of the kernel's own
//! caches), and wholesale per shard past `KNOWN_MAX` inodes. A read that a forget overtook
//! is not kept (`Generation`): it may have read the store before the change. On a shared
//! volume a fact also lasts no longer than the attribute timeout (`max_age`), as the
//! kernel's caches do, so that a change the change log did not bring (a poll that failed
//! for longer than the log keeps rows) is not answered past that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Directories' default ACLs (None: the directory has none), so that a create reads its
/// directory's only once: creates in a directory this mount made find it here from the
/// mkdir on, and a volume with no ACLs pays one read per directory it creates in.
pub type DefaultAcls = Known<Option<Arc<[u8]>>>;

/// Inodes' xattr names (usually none), so that the xattrs `ls -l`, `cp -a` and `tar` ask of
/// every file (security.selinux, system.posix_acl_access) are answered without the store
/// after the first: on PostgreSQL each would be a round trip.
pub type XattrNames = Known<Arc<[Vec<u8>]>>;

/// Open inodes known to have neither set-ID bits nor a file capability, so that a write
/// (every write of an unprivileged caller is flagged) costs no store read (see `setid`).
/// A read that a chmod or setcap overtook is not kept: it may have found the mode before.
pub type NoPrivileges = Known<()>;

pub struct Known<V> {
    /// Each mutex protects one shard: its map (each fact with when it was learned) and its
    /// count of forgets. Leaf locks, held for one map operation.
    shards: Vec<Mutex<Shard<V>>>,
    /// How long a fact is answered; None: until it is forgotten.
    max_age: Option<Duration>,
}

struct Shard<V> {
    by_ino: HashMap<u64, (V, Instant)>,
    forgets: u64,
}

/// A shard's count of forgets when a read began: `set_read` keeps the read only if no
/// forget came since.
#[derive(Clone, Copy)]
pub struct Generation(u64);

/// Inodes whose facts are kept, all shards together (~100 B each).
pub const KNOWN_MAX: usize = 1 << 16;
const SHARDS: usize = 16;

impl<V: Clone> Known<V> {
    pub fn new(max_age: Option<Duration>) -> Known<V> {
        Known {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        by_ino: HashMap::new(),
                        forgets: 0,
                    })
                })
                .collect(),
            max_age,
        }
    }

    fn shard(&self, ino: u64) -> MutexGuard<'_, Shard<V>> {
        self.shards[(ino as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Ok: known; Err: not known, with the generation to read it under.
    pub fn get(&self, ino: u64) -> Result<V, Generation> {
        let mut shard = self.shard(ino);
        match shard.by_ino.get(&ino) {
            Some((known, at)) if self.max_age.is_none_or(|max| at.elapsed() < max) => {
                Ok(known.clone())
            }
            Some(_) => {
                shard.by_ino.remove(&ino);
                Err(Generation(shard.forgets))
            }
            None => Err(Generation(shard.forgets)),
        }
    }

    /// The generation to read `ino`'s fact under, whether it is known or not.
    pub fn generation(&self, ino: u64) -> Generation {
        Generation(self.shard(ino).forgets)
    }

    /// What a read begun at `since` found, kept unless a forget came meanwhile.
    pub fn set_read(&self, ino: u64, fact: V, since: Generation) {
        let mut shard = self.shard(ino);
        if shard.forgets == since.0 {
            Self::insert(&mut shard, ino, fact);
        }
    }

    /// What this mount knows to be so (it just made it).
    pub fn set(&self, ino: u64, fact: V) {
        Self::insert(&mut self.shard(ino), ino, fact);
    }

    fn insert(shard: &mut Shard<V>, ino: u64, fact: V) {
        if shard.by_ino.len() >= KNOWN_MAX / SHARDS {
            shard.by_ino.clear();
        }
        shard.by_ino.insert(ino, (fact, Instant::now()));
    }

    pub fn forget(&self, ino: u64) {
        let mut shard = self.shard(ino);
        shard.by_ino.remove(&ino);
        shard.forgets += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_a_forget_overtook_is_not_kept() {
        let names = XattrNames::new(None);
        let none: Arc<[Vec<u8>]> = Arc::from(Vec::new());
        let Err(since) = names.get(7) else {
            panic!("nothing is known at first")
        };
        names.forget(7);
        names.set_read(7, none.clone(), since);
        let Err(since) = names.get(7) else {
            panic!("a read begun before a forget was kept")
        };
        // Another inode's forget in another shard does not refuse the read.
        names.forget(8);
        names.set_read(7, none, since);
        assert_eq!(names.get(7).ok().map(|n| n.len()), Some(0));
        names.forget(7);
        assert!(names.get(7).is_err());
    }

    #[test]
    fn a_full_shard_starts_again() {
        let acls = DefaultAcls::new(None);
        for i in 0..(KNOWN_MAX / SHARDS) as u64 {
            acls.set(i * SHARDS as u64, None);
        }
        assert!(acls.get(0).is_ok());
        acls.set(KNOWN_MAX as u64 * 2, None);
        assert!(acls.get(0).is_err(), "the shard was not emptied");
        assert!(acls.get(KNOWN_MAX as u64 * 2).is_ok());
    }

    #[test]
    fn a_fact_older_than_max_age_is_read_again() {
        let names = XattrNames::new(Some(Duration::from_millis(50)));
        names.set(3, Arc::from(vec![b"user.k".to_vec()]));
        assert!(names.get(3).is_ok());
        std::thread::sleep(Duration::from_millis(60));
        let Err(since) = names.get(3) else {
            panic!("a fact older than max_age was answered")
        };
        names.set_read(3, Arc::from(Vec::new()), since);
        assert_eq!(names.get(3).ok().map(|n| n.len()), Some(0));
    }
}
