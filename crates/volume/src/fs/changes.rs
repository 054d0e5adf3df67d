//! Other mounts' changes to a shared volume, read from its change log every
//! `CHANGE_POLL_INTERVAL` and turned into FUSE notifications, so that this mount's kernel
//! forgets cached names, attributes and pages that another mount changed within that bound
//! rather than the attribute and entry timeouts.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::meta::{ChangeKind, ChangeRec, MetaStore};

/// The reader of the change log: the last seq read of each other session.
pub(super) struct Follower {
    cursors: HashMap<u64, u64>,
    /// The session's /dev/fuse fd, set once the session is connected.
    session_fd: Arc<OnceLock<i32>>,
    /// Whether the last poll failed (one log line per outage, not one per poll).
    failing: bool,
}

impl Follower {
    pub(super) fn new(session_fd: Arc<OnceLock<i32>>) -> Follower {
        Follower {
            cursors: HashMap::new(),
            session_fd,
            failing: false,
        }
    }

    /// Reads what other sessions changed since the last poll and invalidates it.
    pub(super) fn poll(&mut self, store: &dyn MetaStore) {
        let Some(&fd) = self.session_fd.get() else {
            return;
        };
        match store.changes_since(&mut self.cursors) {
            Ok(changes) => {
                self.failing = false;
                for change in &changes {
                    invalidate(fd, change);
                }
            }
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(
                    "volume: reading the change log: {} (the kernel's caches fall back to their timeouts)",
                    std::io::Error::from_raw_os_error(e)
                );
            }
            Err(_) => {}
        }
    }
}

fn invalidate(fd: i32, change: &ChangeRec) {
    use lanefs_fuse::notify;
    let mut result = notify::inval_inode(fd, change.ino);
    if change.kind == ChangeKind::Entry as i64 {
        if let Some(name) = &change.name {
            result = result.and(notify::inval_entry(fd, change.parent, name));
        }
        result = result.and(notify::inval_inode_attrs(fd, change.parent));
    }
    if let Err(e) = result {
        tracing::debug!("volume: invalidating after change {}: {e}", change.seq);
    }
}
