//! Set-ID bits and file capabilities on write, truncate and chown (issue 17 item 4): the
//! volume negotiates FUSE_HANDLE_KILLPRIV_V2 and drops them itself, by the kernel's own rule
//! (setattr_should_drop_suidgid): a write or truncate by a caller without CAP_FSETID (the
//! kernel flags those) drops set-user-ID, and set-group-ID when the file is group-executable
//! or the caller is outside its group (without group execute the bit means mandatory
//! locking, not a privilege, and a group member keeps it); a chown drops set-user-ID, and
//! set-group-ID by the same rule with root counting as in every group; every write,
//! truncate and chown drops `security.capability`. Without KILLPRIV_V2 the kernel sends
//! FUSE a mode it computed from group execute alone, so an outsider's write would keep a
//! set-group-ID bit that it loses natively.

use lanefs_fuse::Request;

use super::VolumeFs;
use crate::meta::*;

pub(super) const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// What is changing the file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// A write or truncate; `unprivileged`: the kernel flagged the caller as without
    /// CAP_FSETID (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID).
    Data { unprivileged: bool },
    /// A chown (uid or gid).
    Owner,
}

/// The mode `mode` (of a file of group `group`) keeps after `change` by `req`'s caller.
pub(super) fn mode_after(req: &Request, mode: u32, group: u32, change: Change) -> u32 {
    if mode & libc::S_IFMT == libc::S_IFDIR {
        return mode;
    }
    let (drops_user_bit, privileged) = match change {
        Change::Data { unprivileged } => (unprivileged, !unprivileged),
        Change::Owner => (true, req.uid == 0),
    };
    let mut mode = mode;
    if drops_user_bit {
        mode &= !libc::S_ISUID;
    }
    if mode & libc::S_ISGID != 0 {
        let drops_group_bit = match change {
            Change::Data {
                unprivileged: false,
            } => false,
            _ if mode & libc::S_IXGRP != 0 => true,
            _ => !privileged && !lanefs_fuse::caller::in_group(req.pid, req.gid, group),
        };
        if drops_group_bit {
            mode &= !libc::S_ISGID;
        }
    }
    mode
}

impl VolumeFs {
    /// Before a write or truncate of `ino`: drops what `change` takes from the file (see
    /// the module), committed before the data change is answered.
    pub(super) fn drop_privileges(
        &self,
        req: &Request,
        ino: u64,
        change: Change,
    ) -> Result<(), Errno> {
        let since = match self.no_privileges.get(ino) {
            Ok(()) => return Ok(()),
            Err(since) => since,
        };
        let rec = self.store.getattr(req.queue, ino)?;
        if !rec.is_reg() {
            return Ok(());
        }
        let mode = mode_after(req, rec.mode, rec.gid, change);
        if mode != rec.mode {
            let change = AttrChange {
                mode: Some(mode),
                ctime_ns: crate::now_ns(),
                ..AttrChange::default()
            };
            wait(|done| self.store.setattr(ino, change, None, done))?;
            // A fallocate's answer carries no attributes, and the kernel keeps the mode it
            // had: tell it to look again.
            if let Some(&fd) = self.session_fd.get()
                && let Err(e) = lanefs_fuse::notify::inval_inode_attrs(fd, ino)
            {
                tracing::warn!("volume: telling the kernel inode {ino}'s mode changed: {e}");
            }
        }
        self.drop_capability(req, ino)?;
        if mode & (libc::S_ISUID | libc::S_ISGID) == 0 && self.open.get(ino).is_some() {
            self.no_privileges.set_read(ino, (), since);
        }
        Ok(())
    }

    /// Removes `security.capability` from `ino` if it has one.
    pub(super) fn drop_capability(&self, req: &Request, ino: u64) -> Result<(), Errno> {
        if self
            .store
            .getxattr(req.queue, ino, CAPABILITY_XATTR)
            .is_err()
        {
            return Ok(());
        }
        // It may have gone meanwhile.
        self.xattr_names.forget(ino);
        let removed = wait(|done| {
            self.store
                .removexattr(ino, CAPABILITY_XATTR.to_vec(), None, done)
        });
        self.xattr_names.forget(ino);
        match removed {
            Ok(()) | Err(libc::ENODATA) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `rec` was just created by this mount and is open: a new inode has no capability,
    /// so without set-ID bits in its mode its first write needs no store read either.
    pub(super) fn created_without_privileges(&self, rec: &InodeRec) {
        if rec.mode & (libc::S_ISUID | libc::S_ISGID) == 0 {
            self.no_privileges.set(rec.ino, ());
        }
    }

    /// The inode's mode or capability may have changed, or it is no longer open: look
    /// again at the next write. A change forgets before it is committed and again once it
    /// is, so that a write's read of the store in between is not kept either.
    pub(super) fn forget_privileges(&self, ino: u64) {
        self.no_privileges.forget(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uid: u32, gid: u32) -> Request {
        Request {
            unique: 0,
            uid,
            gid,
            pid: 0,
            supp_group: None,
            queue: 0,
        }
    }

    #[test]
    fn modes_after_changes_follow_setattr_should_drop_suidgid() {
        let file = |bits: u32| libc::S_IFREG | bits;
        let member = req(1000, 100);
        let outsider = req(1000, 200);
        let root = req(0, 0);
        let unprivileged = Change::Data { unprivileged: true };
        // (caller, mode, change) → mode after, for a file of group 100.
        for (who, mode, change, after) in [
            (&member, 0o2664, unprivileged, 0o2664),
            (&outsider, 0o2664, unprivileged, 0o0664),
            (&member, 0o2674, unprivileged, 0o0674),
            (&member, 0o6664, unprivileged, 0o2664),
            (
                &root,
                0o6674,
                Change::Data {
                    unprivileged: false,
                },
                0o6674,
            ),
            (&member, 0o2664, Change::Owner, 0o2664),
            (&outsider, 0o2664, Change::Owner, 0o0664),
            (&root, 0o6664, Change::Owner, 0o2664),
            (&root, 0o2674, Change::Owner, 0o0674),
        ] {
            assert_eq!(
                mode_after(who, file(mode), 100, change),
                file(after),
                "uid {} gid {} {mode:o}",
                who.uid,
                who.gid
            );
        }
        let dir = libc::S_IFDIR | 0o2775;
        assert_eq!(mode_after(&outsider, dir, 100, Change::Owner), dir);
    }
}
