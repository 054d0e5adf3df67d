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
