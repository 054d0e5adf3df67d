//! Facts about a request's caller that the request itself does not carry.

/// Whether the process `pid` (a request's caller, whose primary group is `gid`) is in
/// `group`: its primary group, or a supplementary one (from /proc/PID/status; a caller no
/// longer there counts as outside).
pub fn in_group(pid: u32, gid: u32, group: u32) -> bool {
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

/// A request that may wait (for a lock, or a host lease's break): its id, which an INTERRUPT
/// names; the caller's uid, whose share of a wait list it takes; and its thread, watched
/// for a SIGKILL (`is_dying`).
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    pub unique: u64,
    pub uid: u32,
    pub pid: u32,
}

impl Waiting {
    pub fn of(req: &crate::Request) -> Waiting {
        Waiting {
            unique: req.unique,
            uid: req.uid,
            pid: req.pid,
        }
    }

    /// Whether the caller's thread has a SIGKILL pending (/proc/PID/status): it is being
    /// killed and only waits for the answer. The kernel sends one INTERRUPT for a request
    /// whose caller is signalled, but over FUSE-over-io_uring a volume's flock wait killed
    /// at a random moment got none this daemon saw about once in 300 (Linux 6.18; never
    /// over /dev/fuse), and its caller waited unkillable for as long as the lock was held.
    /// The wait lists answer EINTR to a waiter whose caller is dying, at its next try (at
    /// most `WAIT_MAX` later). A thread not found (gone, or in a pid namespace this daemon
    /// cannot see) is not taken for dying.
    pub fn is_dying(&self) -> bool {
        if self.pid == 0 {
            return false;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return false;
        };
        let sigkill = 1u64 << (libc::SIGKILL - 1);
        status
            .lines()
            .filter_map(|line| {
                line.strip_prefix("SigPnd:")
                    .or_else(|| line.strip_prefix("ShdPnd:"))
            })
            .any(|mask| u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & sigkill != 0))
    }
}
