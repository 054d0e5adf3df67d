//! Other mounts' changes to a shared volume, read from its change log every
//! `CHANGE_POLL_INTERVAL` and turned into FUSE notifications, so that this mount's kernel
//! forgets cached names, attributes and pages that another mount changed within that bound
//! rather than the attribute and entry timeouts.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use std::sync::atomic::Ordering;

use super::OpenTable;
use super::fileattr::FileAttrs;
use super::known::{DefaultAcls, NoPrivileges, XattrNames};
use crate::meta::{ChangeKind, ChangeRec, MetaStore, wait};

/// The reader of the change log: the last seq read of each other session.
pub(super) struct Follower {
    pub(super) cursors: HashMap<u64, u64>,
    /// The session's /dev/fuse fd, set once the session is connected.
    pub(super) session_fd: Arc<OnceLock<i32>>,
    /// Whether the last poll failed, or the reload of the chattr flags after it (one log
    /// line per outage; the flags are read again whole once it ends).
    pub(super) failing: bool,
    /// This mount's open files: one another mount unlinked is held (see `ops::hold_orphan`).
    pub(super) open: Arc<OpenTable>,
    /// Directories' default ACLs and inodes' xattr names, forgotten for any inode another
    /// mount changed.
    pub(super) default_acls: Arc<DefaultAcls>,
    pub(super) xattr_names: Arc<XattrNames>,
    /// chattr flags: read again for an inode another mount set them on.
    pub(super) fileattrs: Arc<FileAttrs>,
    /// Open inodes known to have no set-ID bits or capability: forgotten for any inode
    /// another mount changed (its chmod or setcap must be dropped by a write here too).
    pub(super) no_privileges: Arc<NoPrivileges>,
}

impl Follower {
    /// Reads what other sessions changed since the last poll and invalidates it.
    pub(super) fn poll(&mut self, store: &dyn MetaStore) {
        let Some(&fd) = self.session_fd.get() else {
            return;
        };
        match store.changes_since(&mut self.cursors) {
            Ok(changes) => {
                if self.failing {
                    match self.fileattrs.reload_all(store) {
                        Ok(()) => self.failing = false,
                        Err(libc::EAGAIN) => {}
                        Err(e) => tracing::warn!(
                            "volume: reading the chattr flags again after the change log was unreadable: {} (tried again at the next poll)",
                            std::io::Error::from_raw_os_error(e)
                        ),
                    }
                }
                for change in &changes {
                    // Marked before the kernel is told: its next GETATTR or read then
                    // finds the state stale.
                    if let Some(state) = self.open.get(change.ino) {
                        state.changed_elsewhere();
                    }
                    invalidate(fd, change);
                    self.default_acls.forget(change.ino);
                    self.xattr_names.forget(change.ino);
                    self.no_privileges.forget(change.ino);
                    if change.kind == ChangeKind::Entry as i64 {
                        self.hold_if_open(store, change.ino);
                    }
                    if change.kind == ChangeKind::Flags as i64
                        && let Err(e) = self.fileattrs.reload(store, change.ino)
                    {
                        tracing::warn!(
                            "volume: reading inode {}'s chattr flags, which another mount changed: {} (they are enforced as before until its next change)",
                            change.ino,
                            std::io::Error::from_raw_os_error(e)
                        );
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
