//! The passthrough's own counters, shown by `lanefs stats` next to the engine's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Default)]
pub struct Counters {
    /// GETXATTR requests: with kernel passthrough and no HANDLE_KILLPRIV_V2, every write
    /// costs one (security.capability); this shows whether that round trip is gone.
    pub getxattr: PerThreadCounter,
    /// GETXATTRs of security.capability answered "none" from memory, without a host call
    /// (a recent host answer, or a file we just created).
    pub caps_from_memory: PerThreadCounter,
    /// Backing ids registered with FUSE_DEV_IOC_BACKING_OPEN, in all.
    pub backing_opened: AtomicU64,
    /// Backing ids currently registered.
    pub backing_live: AtomicU64,
    /// Opens that wanted passthrough and got another mode (a backing open failed, or the
    /// inode had page-cache opens).
    pub passthrough_declined: AtomicU64,
    /// Writes and truncates where we had the host strip set-user-id bits (KILLPRIV_V2).
    pub kill_suidgid: AtomicU64,
    /// Writes and truncates by callers without CAP_FSETID that had to fstat the file for its
    /// set-ID bits (the inode had not seen its mode within the attribute timeout).
    pub set_id_checks: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Counter stripes: each thread adds to one, `get` sums them. More than the queues of a
/// machine with many CPUs is not needed: threads past it share stripes (still correct).
const STRIPES: usize = 32;

/// One stripe on a cache line of its own (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A counter bumped on every request of some kind (fd-cache hits, GETXATTR): one stripe per
/// thread, so the queues' workers each add to a cache line no other queue writes, instead of
/// all of them bouncing one line between CPUs. Reading sums the stripes (for `lanefs stats`).
pub struct PerThreadCounter {
    stripes: Box<[Stripe]>,
}

impl Default for PerThreadCounter {
    fn default() -> Self {
        PerThreadCounter {
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }
}

impl PerThreadCounter {
    pub fn bump(&self) {
        self.stripes[this_thread_stripe()]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// This thread's stripe: handed out in the order threads first count something.
fn this_thread_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_thread_counts_add_up() {
        let counter = std::sync::Arc::new(PerThreadCounter::default());
        let threads: Vec<_> = (0..(STRIPES + 3))
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| counter.bump()))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(counter.get(), 1000 * (STRIPES as u64 + 3));
    }
}
