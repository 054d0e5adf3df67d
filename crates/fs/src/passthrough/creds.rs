//! Acting as the caller: per-thread fsuid, fsgid, supplementary groups and capabilities for
//! the calls that create inodes, and dropping CAP_FSETID where the host must strip set-user-id
//! bits as it would for the caller.
//!
//! Why per-thread credentials rather than create-then-chown: the host then assigns ownership
//! and checks the parent directory exactly as natively (a set-group-id directory's group, the
//! caller's quota, no window in which the new file belongs to root), in a few syscalls per
//! switch. setfsuid/setfsgid, the raw setgroups and the raw capset change only the calling
//! thread's credentials (glibc's setgroups would change every thread's), and the guards below
//! restore them before the handler returns (on unwind too).
//!
//! A caller other than root acts with no capabilities at all: the host checks its rights on
//! the parent directory as it would natively, so a create that meets a name the kernel did not
//! know of never gets a permission the caller lacks (DAC override, CAP_FOWNER, CAP_MKNOD, ...).
//! Its groups are its fsgid and the one supplementary group the kernel vouches for
//! (FUSE_CREATE_SUPP_GROUP: the parent directory's group, when the caller is in it), which is
//! all that decides the new inode's group and set-group-id bit and the group class of the
//! parent's permission bits; a create the host refuses is tried once more with all of the
//! caller's groups (`caller_groups`), for a parent whose POSIX ACL grants through another. A root caller keeps the daemon's capabilities: the request does
//! not say which a root caller has, and the kernel already checked those it needed.

use super::sys::{self, CAP_FSETID_BIT, CAP_SETGID_BIT, CAP_SETUID_BIT, SysResult};

/// The daemon's own credentials, read once.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// Root with CAP_SETUID and CAP_SETGID: only then are callers impersonated (and
    /// CREATE_SUPP_GROUP asked for).
    pub can_switch: bool,
    uid: u32,
    gid: u32,
    /// The daemon's supplementary groups, put back after acting as a caller.
    groups: Box<[u32]>,
    full_caps: u64,
}

impl Credentials {
    /// Reads the daemon's credentials; a root daemon that cannot switch says so once.
    pub fn of_this_process() -> Credentials {
        let uid = sys::geteuid();
        let full_caps = sys::effective_caps().unwrap_or(0);
        let switch_caps = CAP_SETUID_BIT | CAP_SETGID_BIT;
        let can_switch = uid == 0 && full_caps & switch_caps == switch_caps;
        if uid == 0 && !can_switch {
            tracing::warn!(
                "running as root without CAP_SETUID and CAP_SETGID: files are created as root \
                 and with root's rights, not as the calling user"
            );
        }
        Credentials {
            can_switch,
            uid,
            gid: sys::getegid(),
            groups: sys::groups().unwrap_or_default().into(),
            full_caps,
        }
    }

    /// Runs the next calls as the caller `uid`/`gid`, in the supplementary groups `groups`,
    /// until the guard drops: a no-op when the daemon cannot switch or the caller is the
    /// daemon's own user and group. Fails (EPERM) rather than go on with credentials that
    /// did not take.
    pub fn as_caller(&self, uid: u32, gid: u32, groups: &[u32]) -> SysResult<CallerGuard<'_>> {
        if !self.can_switch || (uid == self.uid && gid == self.gid) {
            return Ok(CallerGuard { creds: None });
        }
        // From here on the guard puts everything back, whatever step fails.
        let guard = CallerGuard { creds: Some(self) };
        // setgroups needs CAP_SETGID, so it goes before the capabilities are dropped.
        sys::set_thread_groups(groups)?;
        sys::set_fsgid(gid);
        sys::set_fsuid(uid);
        if sys::fsgid_now() != gid || sys::fsuid_now() != uid {
            return Err(libc::EPERM);
        }
        if uid != 0 {
            sys::set_effective_caps(0)?;
        }
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

    /// Puts the daemon's own credentials back on this thread. Capabilities first: setgroups
    /// needs CAP_SETGID.
    fn restore(&self) -> SysResult<()> {
        sys::set_effective_caps(self.full_caps)?;
        sys::set_thread_groups(&self.groups)?;
        sys::set_fsuid(self.uid);
        sys::set_fsgid(self.gid);
        if sys::fsuid_now() != self.uid || sys::fsgid_now() != self.gid {
            return Err(libc::EPERM);
        }
        Ok(())
    }
}

/// Most supplementary groups taken from /proc (the kernel's NGROUPS_MAX).
const GROUPS_MAX: usize = 65536;

/// The supplementary groups of the process `pid`, if it acts as `uid`/`gid` (its fsuid and
/// fsgid, the last of the Uid: and Gid: fields of /proc/PID/status): a pid that has gone and
/// been reused by another user's process lends us nothing. None when it cannot be read or
/// does not match. A process of the same ids that took the pid in between could lend its
/// groups, which that user's own processes may hold anyway.
pub fn caller_groups(pid: u32, uid: u32, gid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| status.lines().find_map(|line| line.strip_prefix(name));
    let fs_id = |name: &str| field(name)?.split_whitespace().nth(3)?.parse::<u32>().ok();
    if fs_id("Uid:")? != uid || fs_id("Gid:")? != gid {
        return None;
    }
    field("Groups:")?
        .split_whitespace()
        .take(GROUPS_MAX)
        .map(|g| g.parse().ok())
        .collect()
}

/// Restores the daemon's fsuid, fsgid, groups and capabilities on drop.
pub struct CallerGuard<'a> {
    creds: Option<&'a Credentials>,
}

impl Drop for CallerGuard<'_> {
    fn drop(&mut self) {
        if let Some(creds) = self.creds
            && let Err(e) = creds.restore()
        {
            // This worker would go on serving every later caller with this caller's
            // identity: stopping is the only safe answer to a kernel that refused to give
            // back credentials it just let us give up.
            tracing::error!(
                errno = e,
                "restoring the daemon's credentials failed: aborting"
            );
            std::process::abort();
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
