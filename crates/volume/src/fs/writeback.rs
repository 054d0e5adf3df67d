//! The writeback thread: it flushes files whose unflushed writes have waited
//! `DIRTY_EXPIRE` (so a file kept open and written without fsync, a log, is stored within
//! seconds rather than at its close), and, when the mount's unflushed writes pass their cap
//! (`file::DirtyBudget`), the files holding the most chunk buffers until the mount is a
//! quarter under it, while the writers that met the cap wait (`VolumeFs::write`).
//!
//! A flush that fails here leaves the file's bytes dirty, as any failed flush does: the
//! file's next flush (its close or fsync) commits them or reports why not to its caller. The
//! thread tries such a file again after a back-off (5 s, doubling up to a minute: a failing
//! flush may have rewritten 64 MiB of blocks for nothing, or waited out a database that went
//! away), and logs when a file starts and stops failing, not every pass.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{VolumeFs, errno_name};
use crate::file::{FileState, monotonic_ns};

/// How often the thread looks for files to flush when no writer wakes it.
const WRITEBACK_TICK: Duration = Duration::from_secs(1);
/// A file's oldest unflushed write is flushed after this long (the kernel's page cache
/// waits 30 s by default; a volume's unflushed bytes are the daemon's memory, not the page
/// cache's, and a kill -9 of the daemon loses them, so it waits less).
const DIRTY_EXPIRE: Duration = Duration::from_secs(5);
/// The first and the longest wait before a file whose flush failed here is tried again.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// A file whose last flush here failed: when to try again, and the wait after that.
struct Failing {
    again_ns: i64,
    backoff: Duration,
}

enum Wake {
    /// A writer met the mount's cap.
    OverCap,
    /// Unmounting.
    Stop,
}

pub(super) struct Writeback {
    /// A bound of one: a wake already queued serves every writer that meets the cap meanwhile.
    wake: SyncSender<Wake>,
    /// Taken by `stop` only.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writeback {
    /// Starts the thread for `fs`; None (logged) when no thread can be made: writers that
    /// meet the cap then flush their own files.
    pub(super) fn start(fs: Weak<VolumeFs>) -> Option<Writeback> {
        let (wake, woken) = sync_channel(1);
        match std::thread::Builder::new()
            .name("lanefs-writeback".into())
            .spawn(move || run(&fs, &woken))
        {
            Ok(thread) => Some(Writeback {
                wake,
                thread: Mutex::new(Some(thread)),
            }),
            Err(e) => {
                tracing::warn!(
                    "volume: no writeback thread ({e}): files are flushed at close, fsync and their own limit only"
                );
                None
            }
        }
    }

    /// A writer met the mount's cap.
    pub(super) fn wake(&self) {
        let _ = self.wake.try_send(Wake::OverCap);
    }

    /// Ends the thread once its flush in progress is done.
    pub(super) fn stop(&self) {
        let _ = self.wake.send(Wake::Stop);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn run(fs: &Weak<VolumeFs>, woken: &Receiver<Wake>) {
    // Inodes whose last flush here failed (logged once, until one succeeds).
    let mut failing = HashMap::new();
    loop {
        match woken.recv_timeout(WRITEBACK_TICK) {
            Ok(Wake::OverCap) | Err(RecvTimeoutError::Timeout) => {}
            Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(fs) = fs.upgrade() else {
            return;
        };
        fs.write_back(&mut failing);
    }
}

impl VolumeFs {
    /// One pass: the expired files, then the largest holders while the mount is over its
    /// cap.
    fn write_back(&self, failing: &mut HashMap<u64, Failing>) {
        failing.retain(|ino, _| self.open.get(*ino).is_some());
        let now = monotonic_ns();
        let due = |state: &FileState| {
            failing
                .get(&state.ino)
                .is_none_or(|f: &Failing| f.again_ns <= now)
        };
        // Each with its holding as listed: the sort's key must not change under it.
        let mut dirty: Vec<_> = self
            .open
            .unflushed()
            .into_iter()
            .filter(|state| due(state))
            .map(|state| (state.held_bytes(), state))
            .collect();
        let expired_before = now - DIRTY_EXPIRE.as_nanos() as i64;
        for (_, state) in &dirty {
            if state.dirty_since().is_some_and(|t| t <= expired_before) {
                self.write_back_file(state, failing);
            }
        }
        let budget = &self.data.dirty;
        if !budget.over_cap() {
            return;
        }
        dirty.sort_unstable_by_key(|(held, _)| std::cmp::Reverse(*held));
        for (_, state) in &dirty {
            if budget.under_low_mark() {
                break;
            }
            self.write_back_file(state, failing);
        }
    }

    fn write_back_file(&self, state: &FileState, failing: &mut HashMap<u64, Failing>) {
        if !state.unflushed() {
            return;
        }
        match state.flush_with(&self.data, &*self.store, false) {
            Ok((released, _)) => {
                self.reap_replaced(released);
                self.writeback_flushes.fetch_add(1, Ordering::Relaxed);
                if failing.remove(&state.ino).is_some() {
                    tracing::info!("volume: inode {}'s writeback succeeds again", state.ino);
                }
            }
            Err(e) => {
                let backoff = failing
                    .get(&state.ino)
                    .map_or(RETRY_FIRST, |f| (f.backoff * 2).min(RETRY_MAX));
                let again_ns = monotonic_ns() + backoff.as_nanos() as i64;
                if failing
                    .insert(state.ino, Failing { again_ns, backoff })
                    .is_none()
                {
                    tracing::warn!(
                        "volume: writeback of inode {}: {} (its bytes stay in memory; its next flush, close or fsync retries and reports)",
                        state.ino,
                        errno_name(e)
                    );
                }
            }
        }
    }
}
