//! Directory leases of a shared volume (issue 15): what one mount knows of the leases it
//! holds. A mount answers a change in a directory before its commit (see `dirops`) only
//! while it holds the directory's lease: a row in `leases` naming its session, renewed by its
//! heartbeat, which other mounts respect. Before another mount changes or lists that
//! directory, it recalls the lease and waits (`AsyncDirops::clear_foreign_lease`); the holder
//! sees the recall within `CHANGE_POLL_INTERVAL`, stops answering early there, commits what
//! it answered, and lets go. A holder that died is waited for until its lease expires
//! (`ops::LEASE_TTL` after its last heartbeat); what it answered and never committed is lost
//! with it, as an unacknowledged write is, and never half: its commits were whole batches.
//!
//! The database stays the arbiter: every change committed under a lease runs the same checks
//! as a synchronous one, so a lease lost in a way this mount could not see (its database
//! stalled past the margin) turns a wrong early answer into an error that fsync and close
//! report, never into a wrong volume.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::dirops::Shards;
use crate::ops::LEASE_TTL;

/// This mount stops answering early under a lease this long before the lease expires in
/// the database (by the volume's clock, `store::VolumeClock`), so that its last early answers
/// are committed or refused while the lease still holds: covers a heartbeat that is late and
/// readings of the server's clock a little off.
pub const LEASE_MARGIN: Duration = Duration::from_secs(3);
/// After letting a directory go at another mount's recall, nobody takes it again for this
/// long: two mounts working in one directory then mostly change it synchronously instead of
/// handing the lease back and forth at every change.
pub const LEASE_COOLDOWN: Duration = Duration::from_secs(2);
/// After failing to take a lease (another mount holds it, or it cools down), this mount does
/// not ask again for this long.
pub const LEASE_RETRY: Duration = Duration::from_millis(500);
/// How often a mount waiting for another's lease to go looks again.
pub const RECALL_POLL: Duration = Duration::from_millis(10);
/// How often a mount waiting for another's lease sets the recall again.
pub const RECALL_AGAIN: Duration = Duration::from_secs(1);
/// The longest a mount waits for another's lease: its expiry, and a heartbeat more.
pub const RECALL_WAIT_MAX: Duration = Duration::from_secs(LEASE_TTL.as_secs() + 3);

/// A lease this mount holds.
pub struct Held {
    /// When it was taken (volume time, ns).
    since_ns: i64,
    /// Until when (volume time, ns) changes may be answered early under it: `LEASE_MARGIN`
    /// before the expiry that the last commit renewing it wrote.
    until_ns: AtomicI64,
    /// Early answers in progress under it (from the check until their change is queued).
    users: AtomicU32,
    /// Being let go: no new early answer under it.
    revoked: AtomicBool,
    /// Used since the last heartbeat (a lease unused for a heartbeat is let go).
    used: AtomicBool,
    /// Its row is in the database. A lease taken with the early mkdir of its directory is
    /// not until that create commits, and a heartbeat (which goes ahead of the queue) may
    /// run before: it neither renews nor forgets such a lease.
    committed: AtomicBool,
    /// Names in its directory that this mount looked up in the store under it, which no
    /// listing held (see `AsyncDirops::list_from_store`)...
    store_lookups: AtomicU32,
    /// ...and whether the directory had too many names to list.
    unlistable: AtomicBool,
    /// The directory's default ACL as it is under this lease (None inside: it has none),
    /// once read or known (see `AsyncDirops::inherited_under`), and a count of forgets
    /// (this mount's own changes of it), so that a read a forget overtook is not kept. A
    /// leaf lock, held to copy or set the value.
    default_acl: Mutex<(Option<Option<Vec<u8>>>, u64)>,
}

impl Held {
    /// Counts a name looked up in the store under this lease; whether it is time to read
    /// the directory's listing: at every `nth`, unless it was found `unlistable`.
    pub fn store_lookup_lists(&self, nth: u32) -> bool {
        (self.store_lookups.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(nth)
            && !self.unlistable.load(Ordering::Relaxed)
    }

    pub fn set_unlistable(&self) {
        self.unlistable.store(true, Ordering::Relaxed);
    }

    /// The directory's default ACL under this lease, if known; else the forget count for
    /// `set_default_acl`.
    pub fn default_acl(&self) -> Result<Option<Vec<u8>>, u64> {
        let known = self.default_acl.lock().unwrap_or_else(|e| e.into_inner());
        known.0.clone().ok_or(known.1)
    }

    /// Keeps `value`, read (or made) when the forget count was `forgets`, unless a forget
    /// came since.
    pub fn set_default_acl(&self, value: Option<Vec<u8>>, forgets: u64) {
        let mut known = self.default_acl.lock().unwrap_or_else(|e| e.into_inner());
        if known.1 == forgets {
            known.0 = Some(value);
        }
    }

    /// This mount changes the directory's default ACL under the lease.
    pub fn forget_default_acl(&self) {
        let mut known = self.default_acl.lock().unwrap_or_else(|e| e.into_inner());
        known.0 = None;
        known.1 += 1;
    }
}

/// An early answer in progress under a lease (None: the volume needs none); the lease is
/// not let go before it is dropped, i.e. before the answer's change is queued.
pub struct LeaseUse(Option<Arc<Held>>);

impl LeaseUse {
    pub fn unneeded() -> LeaseUse {
        LeaseUse(None)
    }

    /// Whether the lease still holds at `now_ns`: a use held across a wait (a recall of
    /// another lease) may outlive it, as the heartbeat that renews it waits for this use
    /// when a recall of it came meanwhile.
    pub fn valid_at(&self, now_ns: i64) -> bool {
        self.0
            .as_ref()
            .is_none_or(|held| held.until_ns.load(Ordering::Acquire) > now_ns)
    }

    /// The lease in use (None on a volume that needs none).
    pub fn held(&self) -> Option<&Held> {
        self.0.as_deref()
    }
}

impl Drop for LeaseUse {
    fn drop(&mut self) {
        if let Some(held) = &self.0 {
            held.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The leases this mount holds, and what it refused to retry; counters for `lanefs stats`.
pub struct Leases {
    /// dir → the lease held on it. Shard locks are leaves, held for a map operation.
    held: Shards<u64, Arc<Held>>,
    /// dir → until when (ns) not to try to take it again.
    refused: Shards<u64, i64>,
    /// Directories whose release is queued and not committed yet, so that a recall seen
    /// again meanwhile queues no second one. A leaf lock, held to insert or remove.
    releasing: Arc<Mutex<HashSet<u64>>>,
    /// Leases a heartbeat forgot (not renewed) whose early answers in progress the next
    /// `revoke` still waits for, before anything is let go. A leaf lock.
    lapsed: Mutex<Vec<Arc<Held>>>,
    taken: AtomicU64,
    let_go_at_recall: AtomicU64,
    waited_for_others: AtomicU64,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases {
            held: Shards::new(),
            refused: Shards::new(),
            releasing: Arc::default(),
            lapsed: Mutex::default(),
            taken: AtomicU64::new(0),
            let_go_at_recall: AtomicU64::new(0),
            waited_for_others: AtomicU64::new(0),
        }
    }
}

impl Leases {
    pub fn counters(&self) -> [(&'static str, u64); 3] {
        [
            ("leases_taken", self.taken.load(Ordering::Relaxed)),
            (
                "leases_let_go_at_recall",
                self.let_go_at_recall.load(Ordering::Relaxed),
            ),
            (
                "waits_for_other_mounts_leases",
                self.waited_for_others.load(Ordering::Relaxed),
            ),
        ]
    }

    /// Starts an early answer in `dir` under a lease held and valid at `now_ns`.
    pub fn use_held(&self, dir: u64, now_ns: i64) -> Option<LeaseUse> {
        let held = self.held.shard(dir).get(&dir).cloned()?;
        held.users.fetch_add(1, Ordering::AcqRel);
        // Checked after counting in: a revoke seen here waits for this use to end.
        if held.revoked.load(Ordering::Acquire) || held.until_ns.load(Ordering::Acquire) <= now_ns {
            held.users.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        held.used.store(true, Ordering::Relaxed);
        Some(LeaseUse(Some(held)))
    }

    /// The lease this mount holds on `dir`, if valid at `now_ns` (what a listing known under
    /// it is tied to: a lease let go and taken again is another `Held`).
    pub fn valid_held(&self, dir: u64, now_ns: i64) -> Option<Arc<Held>> {
        let lease = self.use_held(dir, now_ns)?;
        lease.0.clone()
    }

    /// The lease this mount has recorded on `dir`, valid or not.
    pub fn recorded(&self, dir: u64) -> Option<Arc<Held>> {
        self.held.shard(dir).get(&dir).cloned()
    }

    /// Whether this mount holds a valid lease on `dir` at `now_ns`.
    pub fn holds(&self, dir: u64, now_ns: i64) -> bool {
        self.use_held(dir, now_ns).is_some()
    }

    /// Whether taking `dir` was refused recently.
    pub fn refused_recently(&self, dir: u64, now_ns: i64) -> bool {
        let mut refused = self.refused.shard(dir);
        match refused.get(&dir) {
            Some(until) if *until > now_ns => true,
            Some(_) => {
                refused.remove(&dir);
                false
            }
            None => false,
        }
    }

    pub fn refuse_for_now(&self, dir: u64, now_ns: i64) {
        self.refused
            .shard(dir)
            .insert(dir, now_ns + LEASE_RETRY.as_nanos() as i64);
    }

    /// Records a lease taken at `taken_ns` (its expiry `taken_ns + LEASE_TTL`), and starts
    /// the early answer it was taken for.
    pub fn taken(&self, dir: u64, taken_ns: i64) -> LeaseUse {
        self.record(dir, taken_ns, true)
    }

    /// `taken`, for a lease whose row is written by a create still queued (the early mkdir
    /// of its directory): `row_committed` once that create commits.
    pub fn taken_with_create(&self, dir: u64, taken_ns: i64) -> LeaseUse {
        self.record(dir, taken_ns, false)
    }

    /// The create that writes `dir`'s lease row committed.
    pub fn row_committed(&self, dir: u64) {
        if let Some(held) = self.held.shard(dir).get(&dir) {
            held.committed.store(true, Ordering::Release);
        }
    }

    fn record(&self, dir: u64, taken_ns: i64, committed: bool) -> LeaseUse {
        let held = Arc::new(Held {
            since_ns: taken_ns,
            until_ns: AtomicI64::new(valid_until(taken_ns)),
            users: AtomicU32::new(1),
            revoked: AtomicBool::new(false),
            used: AtomicBool::new(true),
            committed: AtomicBool::new(committed),
            store_lookups: AtomicU32::new(0),
            unlistable: AtomicBool::new(false),
            default_acl: Mutex::new((None, 0)),
        });
        self.held.shard(dir).insert(dir, held.clone());
        self.taken.fetch_add(1, Ordering::Relaxed);
        LeaseUse(Some(held))
    }

    /// Forgets `dir`'s lease (its take failed after it was recorded).
    pub fn lost(&self, dir: u64) {
        if let Some(held) = self.held.shard(dir).remove(&dir) {
            held.revoked.store(true, Ordering::Release);
        }
    }

    /// A heartbeat that started at `beat_ns` renewed `renewed` in the database: those stay
    /// valid until `LEASE_MARGIN` before the new expiry; any other taken before the beat, or
    /// one that had lapsed already (the database may have given it to another mount since),
    /// is forgotten (and the next `revoke` waits for its early answers in progress).
    pub fn renewed(&self, beat_ns: i64, renewed: &[u64]) {
        let renewed: std::collections::HashSet<u64> = renewed.iter().copied().collect();
        let mut lapsed = Vec::new();
        for shard in &self.held.shards {
            let mut held = shard.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|dir, h| {
                if h.since_ns >= beat_ns || !h.committed.load(Ordering::Acquire) {
                    return true;
                }
                let keep = renewed.contains(dir) && h.until_ns.load(Ordering::Acquire) > beat_ns;
                if keep {
                    h.until_ns.fetch_max(valid_until(beat_ns), Ordering::AcqRel);
                } else {
                    h.revoked.store(true, Ordering::Release);
                    lapsed.push(h.clone());
                }
                keep
            });
        }
        if !lapsed.is_empty() {
            self.lapsed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .append(&mut lapsed);
        }
    }

    /// Revokes the leases on `dirs` (all unused since the last call, with `idle`) and waits
    /// for the early answers in progress under them; the directories revoked.
    pub fn revoke(&self, dirs: &[u64], idle: bool) -> Vec<u64> {
        let mut revoked = Vec::new();
        for shard in &self.held.shards {
            let mut held = shard.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|dir, h| {
                let go = dirs.contains(dir) || (idle && !h.used.swap(false, Ordering::Relaxed));
                if go {
                    h.revoked.store(true, Ordering::Release);
                    revoked.push((*dir, h.clone()));
                }
                !go
            });
        }
        // And those a heartbeat forgot: a recall of one of them is served by this revoke,
        // whose let-go must not pass an early answer still under way there.
        let lapsed = std::mem::take(&mut *self.lapsed.lock().unwrap_or_else(|e| e.into_inner()));
        for h in revoked.iter().map(|(_, h)| h).chain(&lapsed) {
            // An answer between its check and the queueing of its change: microseconds, but
            // for a create that reads its directory's default ACL under the lease, once per
            // lease (a round trip, longer with the database in trouble): past a thousand
            // yields, it sleeps.
            let mut spins = 0u32;
            while h.users.load(Ordering::Acquire) != 0 {
                spins += 1;
                if spins < 1000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        revoked.into_iter().map(|(dir, _)| dir).collect()
    }

    /// Notes that `dir`'s release is being queued; false if one is queued already. The
    /// closure returned is to be called once it committed or failed.
    pub fn start_release(&self, dir: u64) -> Option<impl FnOnce() + Send + 'static> {
        if !self
            .releasing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dir)
        {
            return None;
        }
        let releasing = self.releasing.clone();
        Some(move || {
            releasing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&dir);
        })
    }

    pub fn count_let_go_at_recall(&self, n: usize) {
        self.let_go_at_recall.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn count_wait(&self) {
        self.waited_for_others.fetch_add(1, Ordering::Relaxed);
    }
}

/// Until when a lease whose expiry was written as `from_ns + LEASE_TTL` may be used.
fn valid_until(from_ns: i64) -> i64 {
    from_ns + (LEASE_TTL - LEASE_MARGIN).as_nanos() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat that runs ahead of the queued mkdir whose create writes the directory's
    /// lease row finds no row to renew: it keeps the lease as it is until the create has
    /// committed, and forgets it only if a later beat does not renew it.
    #[test]
    fn a_beat_ahead_of_the_mkdir_that_writes_a_lease_keeps_it() {
        let leases = Leases::default();
        drop(leases.taken_with_create(7, 1_000));
        leases.renewed(2_000, &[]);
        assert!(
            leases.holds(7, 3_000),
            "forgotten before its row was written"
        );
        leases.row_committed(7);
        leases.renewed(4_000, &[7]);
        assert!(leases.holds(7, 5_000));
        leases.renewed(6_000, &[]);
        assert!(
            !leases.holds(7, 7_000),
            "kept though a beat did not renew it"
        );
    }

    /// A lease a heartbeat forgot while an early answer was under way under it: the next
    /// revoke (whose let-go a recall of it may be) waits for that answer.
    #[test]
    fn a_revoke_waits_for_answers_under_a_lease_a_beat_forgot() {
        let leases = Arc::new(Leases::default());
        let answer = leases.taken(7, 1_000);
        leases.renewed(2_000, &[]);
        assert!(!leases.holds(7, 3_000));
        let revoking = {
            let leases = leases.clone();
            std::thread::spawn(move || leases.revoke(&[7], false))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !revoking.is_finished(),
            "the revoke passed an answer under way"
        );
        drop(answer);
        assert!(revoking.join().unwrap().is_empty());
    }
}
