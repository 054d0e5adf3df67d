//! The per-inode write gate (seed 000): writes that end at or below the current size run in
//! parallel (shared), writes that extend the file, truncates and fallocates run alone
//! (exclusive). The size is an atomic so that lseek and getattr never wait on the gate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

pub struct WriteGate {
    /// Held shared by non-extending writes, exclusive by extending writes, truncate and
    /// fallocate of the inode. Lock order: a leaf; nothing is taken while holding it except
    /// the host syscall it guards.
    lock: RwLock<()>,
    /// The file's size as last seen by us (stat, truncate, extending writes). A hint for
    /// choosing shared or exclusive: the host fs keeps each write atomic on its own.
    size: AtomicU64,
}

/// Held while a write runs: one of the two guards.
pub struct GateGuard<'a> {
    _shared: Option<RwLockReadGuard<'a, ()>>,
    _exclusive: Option<RwLockWriteGuard<'a, ()>>,
}

impl GateGuard<'_> {
    #[cfg(test)]
    fn is_shared(&self) -> bool {
        self._shared.is_some()
    }
}

impl WriteGate {
    pub fn new(size: u64) -> WriteGate {
        WriteGate {
            lock: RwLock::new(()),
            size: AtomicU64::new(size),
        }
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Records a size read from the host (getattr, lookup, truncate). Written only when it
    /// changed: every getattr of a hot file records its size, and a store would take the
    /// line away from the other CPUs reading it.
    pub fn set_size(&self, size: u64) {
        if self.size.load(Ordering::Relaxed) != size {
            self.size.store(size, Ordering::Relaxed);
        }
    }

    /// Enters for a write ending at `end`. With `parallel` false every write is exclusive.
    pub fn enter_write(&self, end: u64, parallel: bool) -> GateGuard<'_> {
        if parallel && end <= self.size() {
            let shared = self.lock.read().unwrap_or_else(|e| e.into_inner());
            // A truncate may have shrunk the file while we waited.
            if end <= self.size() {
                return GateGuard {
                    _shared: Some(shared),
                    _exclusive: None,
                };
            }
        }
        GateGuard {
            _shared: None,
            _exclusive: Some(self.exclusive()),
        }
    }

    /// As `enter_write`, but None instead of waiting (a truncate, fallocate or extending
    /// write holds the gate, or waits for it): the caller then waits where it blocks nobody.
    pub fn try_enter_write(&self, end: u64, parallel: bool) -> Option<GateGuard<'_>> {
        if parallel && end <= self.size() {
            let shared = unpoisoned(self.lock.try_read())?;
            if end <= self.size() {
                return Some(GateGuard {
                    _shared: Some(shared),
                    _exclusive: None,
                });
            }
        }
        let exclusive = unpoisoned(self.lock.try_write())?;
        Some(GateGuard {
            _shared: None,
            _exclusive: Some(exclusive),
        })
    }

    /// After a write that ended at `end` succeeded.
    pub fn written(&self, end: u64) {
        // A write inside the file (the common case) changes nothing: no read-modify-write.
        if end > self.size.load(Ordering::Relaxed) {
            self.size.fetch_max(end, Ordering::Relaxed);
        }
    }

    /// For truncate and fallocate.
    pub fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The guard of a try-lock, poisoned or not; None when it would block.
fn unpoisoned<G>(attempt: std::sync::TryLockResult<G>) -> Option<G> {
    match attempt {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extending_writes_are_exclusive_others_shared() {
        let gate = WriteGate::new(4096);
        assert!(gate.enter_write(4096, true).is_shared());
        assert!(!gate.enter_write(4097, true).is_shared());
        assert!(!gate.enter_write(10, false).is_shared());
        let a = gate.enter_write(100, true);
        let b = gate.enter_write(200, true);
        assert!(a.is_shared() && b.is_shared());
        drop((a, b));
        gate.written(8192);
        assert_eq!(gate.size(), 8192);
        gate.written(10);
        assert_eq!(gate.size(), 8192);
    }

    #[test]
    fn a_write_that_would_wait_is_told_instead() {
        let gate = WriteGate::new(4096);
        assert!(gate.try_enter_write(100, true).unwrap().is_shared());
        assert!(!gate.try_enter_write(8192, true).unwrap().is_shared());
        {
            let _truncate = gate.exclusive();
            assert!(gate.try_enter_write(100, true).is_none());
            assert!(gate.try_enter_write(8192, true).is_none());
        }
        let _shared = gate.enter_write(100, true);
        // Shared writers run together; an extending one would wait for them.
        assert!(gate.try_enter_write(200, true).is_some());
        assert!(gate.try_enter_write(8192, true).is_none());
    }
}
