//! Access times on the volume (issue 17 item 3): reads and listings move atime by the
//! mount's rule (noatime, relatime, strictatime, nodiratime; a read-only mount counts as
//! noatime; an inode's FS_NOATIME_FL too), exactly as the kernel decides for its own file
//! systems, in the volume's records.
//!
//! FUSE inodes are S_NOATIME: the kernel moves no atime itself and tells us of no read it
//! serves from its page cache. So an open after which the next read must move atime (by the
//! rule, from the inode's times at the open; under strictatime every open) is answered
//! without FOPEN_KEEP_CACHE, which makes the kernel drop the file's cached pages and send
//! that read here, and gets a handle of its own with [`FH_ATIME_DUE`] set. Under relatime
//! the first read of such an open applies the rule (one store read) and later ones cost
//! nothing (`AtimeDue`); under strictatime every read moves atime.
//!
//! A read does not wait for its atime's commit (`cp -a` out of a volume paid one commit per
//! file on its reads): the new atime goes to [`PendingAtimes`], which every attribute answer
//! of this mount overlays, so a stat right after the read sees it, and one queued change
//! commits every pending atime at once. fsync, fsyncdir and syncfs queue behind it, so
//! they make the atimes of reads before them durable like any change; a kill -9 before its
//! commit loses those atimes (never anything else). A setattr that sets atime drops the
//! inode's pending one first: the commit order is the requests' order either way.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lanefs_fuse::Reply;
use lanefs_fuse::abi::{self, fopen};
use lanefs_fuse::atime::{Atime, AtimeRule};
use lanefs_fuse::fileattr::FS_NOATIME_FL;

use super::{OPEN_SHARDS, VolumeFs};
use crate::meta::*;
use crate::now_ns;

/// In an open's fh: its reads may have to move atime (the other bits number the open).
const FH_ATIME_DUE: u64 = 1;

/// The mount's atime flags ([`Atime::to_bits`]); a remount changes them from the mount
/// table's watcher thread.
#[derive(Clone)]
pub struct AtimeSwitch(Arc<AtomicU8>);

impl AtimeSwitch {
    pub(super) fn new(atime: Atime) -> AtimeSwitch {
        AtimeSwitch(Arc::new(AtomicU8::new(atime.to_bits())))
    }

    pub fn set(&self, atime: Atime) {
        self.0.store(atime.to_bits(), Ordering::Relaxed)
    }

    fn get(&self) -> Atime {
        Atime::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// The handles of opens whose first read has yet to apply the relatime rule.
pub(super) struct AtimeDue {
    /// Each mutex protects one shard's set; leaf locks, held for one set operation.
    shards: Vec<Mutex<HashSet<u64>>>,
    /// The next open's number (fh = number << 1, with FH_ATIME_DUE set where due).
    next: AtomicU64,
}

impl AtimeDue {
    pub(super) fn new() -> AtimeDue {
        AtimeDue {
            shards: (0..OPEN_SHARDS)
                .map(|_| Mutex::new(HashSet::new()))
                .collect(),
            next: AtomicU64::new(1),
        }
    }

    fn shard(&self, fh: u64) -> MutexGuard<'_, HashSet<u64>> {
        self.shards[((fh >> 1) as usize) % OPEN_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A new open's handle, its own whether or not its reads may move atime (`due`): a
    /// shared volume's OFD locks go at their open's RELEASE by its handle (see `locks`),
    /// and with one handle shared by every open whose reads move no atime, the release of
    /// any of them dropped the locks of all the others.
    fn new_handle(&self, due: bool) -> u64 {
        let number = self.next.fetch_add(1, Ordering::Relaxed) << 1;
        if !due {
            return number;
        }
        let fh = number | FH_ATIME_DUE;
        self.shard(fh).insert(fh);
        fh
    }

    /// Whether `fh` was still waiting for its first read (it no longer is).
    fn take(&self, fh: u64) -> bool {
        self.shard(fh).remove(&fh)
    }

    /// The open `fh` is released.
    pub(super) fn release(&self, fh: u64) {
        if fh & FH_ATIME_DUE != 0 {
            self.take(fh);
        }
    }
}

/// Atimes this mount moved: ino → atime, until one commit after the commit that stored it.
///
/// Why an entry outlives its commit: an answer reads the store, then overlays these. One
/// whose store read came before a commit, and whose overlay came after that commit's entries
/// were dropped, would have neither the new atime nor its entry (a stat right after a read
/// saw the new atime, the next one the old). So a commit only marks its entries; the commit
/// after it drops them. An answer that saw at most one commit complete while it read
/// (`commits` before and after) therefore found every atime, in the store or here;
/// [`PendingAtimes::read`] reads again in the rare case that two did.
pub(crate) struct PendingAtimes {
    /// Each mutex protects one shard's map; leaf locks, held for one map operation (the
    /// commit's `take` holds one shard at a time).
    shards: Vec<Mutex<HashMap<u64, PendingAtime>>>,
    /// Entries in all shards: attribute answers look at no shard while there are none.
    len: AtomicUsize,
    /// A change that commits them is queued and has not taken them yet.
    queued: AtomicBool,
    /// Commits of pending atimes completed; bumped before a commit marks or drops entries.
    commits: AtomicU64,
    /// The atimes the last commit stored, which the next one drops. Taken by commits only
    /// (one at a time: the committer runs them in order); locked before a shard.
    last_committed: Mutex<Vec<(u64, i64)>>,
}

#[derive(Clone, Copy, PartialEq)]
struct PendingAtime {
    atime_ns: i64,
    /// The commit that stored it (`commits` after it), or 0 while it waits for one.
    committed_in: u64,
}

impl PendingAtimes {
    pub(super) fn new() -> PendingAtimes {
        PendingAtimes {
            shards: (0..OPEN_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            len: AtomicUsize::new(0),
            queued: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            last_committed: Mutex::new(Vec::new()),
        }
    }

    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, PendingAtime>> {
        self.shards[(ino as usize) % OPEN_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `rec` as this mount sees it: with its pending atime.
    pub(crate) fn overlay(&self, rec: &mut InodeRec) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(entry) = self.shard(rec.ino).get(&rec.ino) {
            rec.atime_ns = entry.atime_ns;
        }
    }

    /// Runs `read_and_overlay` (store reads whose records it overlays) until at most one
    /// commit completed during it, a bounded number of times: then no atime slipped
    /// between its store read and its overlay (see the type).
    pub(crate) fn read<T>(&self, mut read_and_overlay: impl FnMut() -> T) -> T {
        let mut reads = 1;
        loop {
            let before = self.commits();
            let out = read_and_overlay();
            if !self.missed_since(before) || reads == READS_MAX {
                return out;
            }
            reads += 1;
        }
    }

    /// How many commits have completed: for [`PendingAtimes::missed_since`].
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// Whether records read from the store after `commits` read `before` may lack an atime
    /// this overlay no longer has: two commits or more completed since.
    pub(crate) fn missed_since(&self, before: u64) -> bool {
        self.commits() - before > 1
    }

    /// Records `ino`'s new atime; true when no queued change will take it, so the caller
    /// must queue one.
    fn record(&self, ino: u64, atime_ns: i64) -> bool {
        // `len` changes under the shard's lock with the entry, so it never goes below 0.
        let mut shard = self.shard(ino);
        let pending = PendingAtime {
            atime_ns,
            committed_in: 0,
        };
        if shard.insert(ino, pending).is_none() {
            self.len.fetch_add(1, Ordering::AcqRel);
        }
        drop(shard);
        !self.queued.swap(true, Ordering::AcqRel)
    }

    /// A setattr sets `ino`'s atime: its pending one must not be committed after it, nor
    /// overlaid on its answers.
    pub(super) fn forget(&self, ino: u64) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut shard = self.shard(ino);
        if shard.remove(&ino).is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// For the queued change, when it runs: every atime waiting for a commit. An atime
    /// recorded after `queued` is cleared queues a change of its own (at worst one with
    /// nothing to do).
    fn take(&self) -> Vec<(u64, i64)> {
        self.queued.store(false, Ordering::Release);
        let mut all = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(
                shard
                    .iter()
                    .filter(|(_, entry)| entry.committed_in == 0)
                    .map(|(&ino, entry)| (ino, entry.atime_ns)),
            );
        }
        all
    }

    /// `atimes` are committed: the previous commit's entries are dropped, these are marked
    /// (each unless it was moved again since). Whether any was marked (and so waits for the
    /// next commit to be dropped).
    fn committed(&self, atimes: Vec<(u64, i64)>) -> bool {
        let mut last = self
            .last_committed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let commit = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        for &(ino, atime_ns) in last.iter() {
            let stored = PendingAtime {
                atime_ns,
                committed_in: commit - 1,
            };
            let mut shard = self.shard(ino);
            if shard.get(&ino) == Some(&stored) {
                shard.remove(&ino);
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let mut marked = false;
        for &(ino, atime_ns) in &atimes {
            let mut shard = self.shard(ino);
            if let Some(entry) = shard.get_mut(&ino)
                && entry.atime_ns == atime_ns
                && entry.committed_in == 0
            {
                entry.committed_in = commit;
                marked = true;
            }
        }
        *last = atimes;
        marked
    }
}

/// Reads by one answer while atime commits keep completing (two or more during each read).
const READS_MAX: usize = 4;

impl VolumeFs {
    /// The handle of the mount's atime flags, for following remounts.
    pub fn atime_switch(&self) -> AtimeSwitch {
        self.atime.clone()
    }

    /// Whether an access now moves `rec`'s atime (its times as the kernel sees them).
    fn atime_moves(&self, rec: &InodeRec, now: i64) -> bool {
        let mut rec = rec.clone();
        self.pending_atimes.overlay(&mut rec);
        let mtime = self
            .open
            .get(rec.ino)
            .and_then(|state| state.dirty_mtime())
            .unwrap_or(rec.mtime_ns);
        let ctime = rec.ctime_ns.max(mtime);
        self.fileattrs.get(rec.ino) & FS_NOATIME_FL == 0
            && self
                .atime
                .get()
                .moves(rec.is_dir(), rec.atime_ns, mtime, ctime, now)
    }

    /// The answer to an open of `rec` with `flags`, with a handle of its own: marked, and
    /// without FOPEN_KEEP_CACHE, when its reads may move atime.
    pub(super) fn open_out(&self, rec: &InodeRec, flags: u32) -> abi::OpenOut {
        let mut open_flags = self.open_flags(flags);
        let due = match self.atime.get().rule {
            AtimeRule::Never => false,
            AtimeRule::Always => true,
            AtimeRule::Relative => self.atime_moves(rec, now_ns()),
        };
        if due {
            open_flags &= !fopen::KEEP_CACHE;
        }
        abi::OpenOut {
            fh: self.atime_due.new_handle(due),
            open_flags,
            backing_id: 0,
        }
    }

    /// Answers a read of `ino` through open `fh` with `bytes`, first moving its atime if
    /// the rule says so.
    pub(super) fn reply_read(&self, queue: usize, ino: u64, fh: u64, bytes: Vec<u8>, reply: Reply) {
        if fh & FH_ATIME_DUE == 0 {
            return reply.data(&bytes);
        }
        let now = now_ns();
        let moves = match self.atime.get().rule {
            AtimeRule::Never => false,
            AtimeRule::Always => self.fileattrs.get(ino) & FS_NOATIME_FL == 0,
            // At most once per open: after it, atime is after mtime and ctime.
            AtimeRule::Relative => {
                self.atime_due.take(fh)
                    && self.pending_atimes.read(|| {
                        self.store
                            .getattr(queue, ino)
                            .is_ok_and(|rec| self.atime_moves(&rec, now))
                    })
            }
        };
        if !moves {
            return reply.data(&bytes);
        }
        self.touch_then_reply(ino, now, bytes, reply);
    }

    /// Answers a READDIR with `bytes`; when it took the listing of directory `rec`, first
    /// moves the directory's atime if the rule says so.
    pub(super) fn reply_listing(&self, rec: Option<&InodeRec>, bytes: &[u8], reply: Reply) {
        let now = now_ns();
        let Some(rec) = rec.filter(|rec| self.atime_moves(rec, now)) else {
            return reply.data(bytes);
        };
        self.touch_then_reply(rec.ino, now, bytes.to_vec(), reply);
    }

    /// Moves `ino`'s atime to `now` and answers with `bytes` at once: the atime is pending
    /// (overlaid on this mount's answers) until the queued change commits it.
    fn touch_then_reply(&self, ino: u64, now: i64, bytes: Vec<u8>, reply: Reply) {
        // An inode answered early keeps a predicted record: it is read back after this.
        self.dirops.mark_stale(ino);
        if self.pending_atimes.record(ino, now) {
            queue_atime_commit(self.store.clone(), self.pending_atimes.clone());
        }
        reply.data(&bytes)
    }
}

/// Queues the change that commits every pending atime. When its commit leaves entries
/// overlaid (they outlive it by one commit, see [`PendingAtimes`]) and no read has queued
/// the next commit meanwhile, it queues that one itself, with nothing to store but those
/// entries to drop: left until some later read, they would cost every attribute answer a
/// shard lock and hide atimes set by other mounts.
fn queue_atime_commit(store: Arc<dyn MetaStore>, pending: Arc<PendingAtimes>) {
    let take_from = pending.clone();
    store.clone().touch_atimes(
        Box::new(move || take_from.take()),
        Box::new(move |r| match r {
            Ok(atimes) => {
                if pending.committed(atimes) && !pending.queued.swap(true, Ordering::AcqRel) {
                    queue_atime_commit(store, pending);
                }
            }
            // Left pending: the next change queued takes them again.
            Err(e) => tracing::warn!(
                "volume: committing access times: {}; tried again with the next",
                std::io::Error::from_raw_os_error(e)
            ),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a store read returns for inode 7 with atime `atime_ns`, overlaid.
    fn answered(pending: &PendingAtimes, atime_ns: i64) -> i64 {
        let mut rec = InodeRec {
            ino: 7,
            atime_ns,
            ..Default::default()
        };
        pending.overlay(&mut rec);
        rec.atime_ns
    }

    #[test]
    fn an_answer_that_read_the_store_before_a_commit_keeps_the_committed_atime() {
        let pending = PendingAtimes::new();
        assert!(pending.record(7, 200));
        // An answer reads the store (atime 100) before the commit of 200 completes ...
        let before = pending.commits();
        let taken = pending.take();
        assert_eq!(taken, vec![(7, 200)]);
        assert!(
            pending.committed(taken),
            "the commit marked nothing to drop later"
        );
        // ... and overlays after it: it still finds 200, with no reason to read again.
        assert_eq!(answered(&pending, 100), 200);
        assert!(!pending.missed_since(before));
        // Nothing is committed twice.
        assert!(pending.take().is_empty());

        // The next commit drops it: an answer that read the store before the first one
        // would miss 200 now, and is told to read again; one that reads now finds it.
        assert!(!pending.committed(pending.take()));
        assert_eq!(answered(&pending, 100), 100);
        assert!(pending.missed_since(before));
        assert_eq!(pending.len.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_atime_moved_again_after_its_commit_took_it_stays_pending() {
        let pending = PendingAtimes::new();
        assert!(pending.record(7, 200));
        let taken = pending.take();
        // Read again while the commit of 200 runs: its own change is queued.
        assert!(pending.record(7, 300));
        pending.committed(taken);
        pending.committed(Vec::new());
        assert_eq!(answered(&pending, 200), 300);
        assert_eq!(pending.take(), vec![(7, 300)]);
    }

    #[test]
    fn a_setattr_of_atime_drops_a_committed_atime_too() {
        let pending = PendingAtimes::new();
        pending.record(7, 200);
        pending.committed(pending.take());
        pending.forget(7);
        assert_eq!(answered(&pending, 50), 50);
        // The commit that would have dropped it finds nothing to drop.
        pending.committed(Vec::new());
        assert_eq!(pending.len.load(Ordering::Relaxed), 0);
    }

    /// The last commit of a burst of reads leaves its atimes overlaid; the commit it queues
    /// drops them, so a mount whose reads stopped overlays nothing (no shard lock per
    /// answer, no atime of another mount hidden). With a real SQLite volume's committer.
    #[test]
    fn the_commit_after_the_last_read_drops_what_it_overlaid() {
        use crate::meta::ROOT_INO;
        use crate::sqlite::SqliteStore;
        use std::time::{Duration, Instant};
        let dir = std::env::temp_dir().join(format!("lanefs-atime-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("v.db");
        crate::volume::format(&db, &dir.join("data"), false).unwrap();
        let store: Arc<dyn MetaStore> =
            Arc::new(SqliteStore::open(&db, "test", "/none", 1).unwrap());
        let pending = Arc::new(PendingAtimes::new());

        assert!(pending.record(ROOT_INO, 1234));
        queue_atime_commit(store.clone(), pending.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while pending.len.load(Ordering::Acquire) != 0 {
            assert!(
                Instant::now() < deadline,
                "a committed atime is still overlaid after {} commits",
                pending.commits()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(pending.commits(), 2, "one commit to store, one to drop");
        assert_eq!(store.getattr(0, ROOT_INO).unwrap().atime_ns, 1234);
        store.close();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
