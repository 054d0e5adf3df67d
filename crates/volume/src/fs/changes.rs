//! Other mounts' changes to a shared volume, read from its change log every
//! `CHANGE_POLL_INTERVAL` and turned into FUSE notifications, so that this mount's kernel
//! forgets cached names, attributes and pages that another mount changed within that bound
//! rather than the attribute and entry timeouts.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use std::sync::atomic::Ordering;

use super::OpenTable;
use super::known::{DefaultAcls, XattrNames};
use crate::meta::{ChangeKind, ChangeRec, MetaStore, wait};

/// The reader of the change log: the last seq read of each other session.
pub(super) struct Follower {
    cursors: HashMap<u64, u64>,
    /// The session's /dev/fuse fd, set once the session is connected.
    session_fd: Arc<OnceLock<i32>>,
    /// Whether the last poll failed (one log line per outage, not one per poll).
    failing: bool,
    /// This mount's open files: one another mount unlinked is held (see `ops::hold_orphan`).
    open: Arc<OpenTable>,
    /// Directories' default ACLs and inodes' xattr names, forgotten for any inode another
    /// mount changed.
    default_acls: Arc<DefaultAcls>,
    xattr_names: Arc<XattrNames>,
}

impl Follower {
    pub(super) fn new(
        session_fd: Arc<OnceLock<i32>>,
        open: Arc<OpenTable>,
        default_acls: Arc<DefaultAcls>,
        xattr_names: Arc<XattrNames>,
    ) -> Follower {
        Follower {
            cursors: HashMap::new(),
            session_fd,
            failing: false,
            open,
            default_acls,
            xattr_names,
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
                    self.default_acls.forget(change.ino);
                    self.xattr_names.forget(change.ino);
                    if change.kind == ChangeKind::Entry as i64 {
                        self.hold_if_open(store, change.ino);
                    }
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

impl Follower {
    /// A name of `ino` changed on another mount: if this mount has it open and it lost its
    /// last name there, hold it so that it stays readable here until the last close.
    fn hold_if_open(&self, store: &dyn MetaStore, ino: u64) {
        let Some(state) = self.open.get(ino) else {
            return;
        };
        if state.held_for_other_mount.load(Ordering::Relaxed) {
            return;
        }
        match wait(|done| store.hold_orphan(ino, done)) {
            Ok(held) => {
                state.held_for_other_mount.store(held, Ordering::Relaxed);
                // Its last close may have come meanwhile and seen no hold to let go.
                let still_open = self.open.get(ino).is_some_and(|s| Arc::ptr_eq(&s, &state));
                if held && !still_open {
                    let _ = wait(|done| store.release_hold(ino, done));
                }
            }
            Err(e) => tracing::warn!(
                "volume: holding inode {ino}, unlinked on another mount while open here: {}",
                std::io::Error::from_raw_os_error(e)
            ),
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
