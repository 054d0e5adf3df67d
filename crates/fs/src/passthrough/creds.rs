//! Acting as the caller: per-thread fsuid/fsgid for the calls that create inodes, and
//! dropping CAP_FSETID where the host must strip set-user-id bits as it would for the caller.
//!
//! Why per-thread fsuid rather than create-then-chown: the host then assigns ownership
//! exactly as natively (a set-group-id directory's group, the caller's quota, no window in
//! which the new file belongs to root), in one syscall per switch. setfsuid/setfsgid and the
//! raw capset change only the calling thread's credentials, and the guards below restore
//! them before the handler returns (on unwind too).
//!
//! A non-root fsuid clears the file-system capabilities from the effective set; we raise them
//! again without CAP_FSETID, because the kernel already checked the caller's permissions
//! (default_permissions is always on as root) and the host should not check them a second
//! time against the daemon's supplementary groups, while CAP_FSETID must stay off so that
//! the host clears set-group-id bits on new files the caller may not have them on.

use super::sys::{self, CAP_FSETID_BIT, SysResult};

/// The daemon's own credentials, read once.
#[derive(Debug, Clone, Copy)]
pub struct Credentials {
    /// Root with capabilities to switch: only then are callers impersonated.
    pub can_switch: bool,
    uid: u32,
    gid: u32,
    full_caps: u64,
}

impl Credentials {
    pub fn of_this_process() -> Credentials {
        let uid = sys::geteuid();
        let full_caps = sys::effective_caps().unwrap_or(0);
        Credentials {
            can_switch: uid == 0 && full_caps & CAP_FSETID_BIT != 0,
            uid,
            gid: sys::getegid(),
            full_caps,
        }
    }

    /// Runs the next calls as `uid`/`gid` until the guard drops (a no-op when the daemon
    /// is not root or the caller is the daemon's own user).
    pub fn as_caller(&self, uid: u32, gid: u32) -> SysResult<CallerGuard<'_>> {
        if !self.can_switch || (uid == self.uid && gid == self.gid) {
            return Ok(CallerGuard { creds: None });
        }
        sys::set_fsgid(gid);
        sys::set_fsuid(uid);
        let guard = CallerGuard { creds: Some(self) };
        sys::set_effective_caps(self.full_caps & !CAP_FSETID_BIT)?;
        Ok(guard)
    }

    /// Runs the next calls without CAP_FSETID until the guard drops, so the host strips
    /// set-user-id bits and security.capability on write or truncate as it would for an
    /// unprivileged caller. `needed` false makes it a no-op.
    pub fn without_fsetid(&self, needed: bool) -> SysResult<FsetidGuard<'_>> {
        if !needed || self.full_caps & CAP_FSETID_BIT == 0 {
            return Ok(FsetidGuard { creds: None });
        }
        sys::set_effective_caps(self.full_caps & !CAP_FSETID_BIT)?;
        Ok(FsetidGuard { creds: Some(self) })
    }
}

/// Whether the process `pid` (primary group `gid`) is in `group`: its primary group or one
/// of its supplementary groups (from /proc; false when it cannot be read).
pub fn caller_in_group(pid: u32, gid: u32, group: u32) -> bool {
    if gid == group {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(group)))
}

/// Restores the daemon's fsuid, fsgid and capabilities on drop.
pub struct CallerGuard<'a> {
    creds: Option<&'a Credentials>,
}

impl Drop for CallerGuard<'_> {
    fn drop(&mut self) {
        if let Some(creds) = self.creds {
            sys::set_fsuid(creds.uid);
            sys::set_fsgid(creds.gid);
            if let Err(e) = sys::set_effective_caps(creds.full_caps) {
                tracing::error!(errno = e, "restoring the daemon's capabilities failed");
            }
        }
    }
}

/// Restores CAP_FSETID on drop.
pub struct FsetidGuard<'a> {
    creds: Option<&'a Credentials>,
}

impl Drop for FsetidGuard<'_> {
    fn drop(&mut self) {
        if let Some(creds) = self.creds
            && let Err(e) = sys::set_effective_caps(creds.full_caps)
        {
            tracing::error!(errno = e, "restoring CAP_FSETID failed");
        }
    }
}
