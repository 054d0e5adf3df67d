//! Mounting and unmounting: mount(2) directly as root, fusermount3 otherwise; checks that
//! explain a bad mount point in one sentence; reading /proc/self/mountinfo.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountSpec {
    pub mountpoint: PathBuf,
    /// Shown as the mount's source in /proc/mounts (`df`, `findmnt`).
    pub fsname: String,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// MS_* flags (MS_RDONLY, MS_NOSUID, ...).
    pub flags: libc::c_ulong,
}

/// The file system type we register as.
pub const FSTYPE: &str = "fuse.lanefs";

/// A mount in /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq)]
pub struct MountInfo {
    /// The mount's id, and the id of the mount it sits on.
    pub id: u32,
    pub parent: u32,
    pub major: u32,
    pub minor: u32,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The mount's own flags, as mountinfo writes them ("rw,nosuid,nodev,noatime").
    pub options: String,
}

/// Undoes the octal escapes (\040 for space, ...) of /proc/self/mountinfo.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + (d - b'0') as u32);
                out.push(value as u8);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Parses one line of /proc/self/mountinfo.
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let mut fields = line.split(' ');
    let id = fields.next()?.parse().ok()?;
    let parent = fields.next()?.parse().ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let _root = fields.next()?;
    let mountpoint = PathBuf::from(OsStr::from_bytes(&unescape(fields.next()?)));
    let options = fields.next()?.to_string();
    // Optional fields end with a lone "-".
    let mut rest = fields.skip_while(|f| *f != "-");
    rest.next()?;
    let fstype = rest.next()?.to_string();
    let source = String::from_utf8_lossy(&unescape(rest.next()?)).into_owned();
    Some(MountInfo {
        id,
        parent,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mountpoint,
        fstype,
        source,
        options,
    })
}

/// The mounts that sit on the mount `id`: inside its tree or stacked on its root. Unmounting
/// it lazily would detach them too.
pub fn mounts_on(id: u32) -> io::Result<Vec<MountInfo>> {
    Ok(mounts()?
        .into_iter()
        .filter(|m| sits_on(m, &[id]))
        .collect())
}

/// Whether `mount` sits on one of the mounts `ours` (its parent is one of them) without
/// being one of them itself.
pub fn sits_on(mount: &MountInfo, ours: &[u32]) -> bool {
    ours.contains(&mount.parent) && !ours.contains(&mount.id)
}

/// Watches the flags of the mount with device `major:minor` (the first one, if it is bound
/// elsewhere too) on a thread of its own: calls `changed` with its mountinfo options each
/// time they change (a remount), until the mount is gone. The kernel wakes readers of
/// /proc/self/mountinfo with POLLPRI when the mount table changes, so this costs nothing
/// between changes.
pub fn watch_mount_options(
    (major, minor): (u32, u32),
    mut changed: impl FnMut(&str) + Send + 'static,
) -> io::Result<()> {
    let mut file = File::open("/proc/self/mountinfo")?;
    let ours = move |text: &str| {
        text.lines()
            .filter_map(parse_mountinfo_line)
            .find(|m| (m.major, m.minor) == (major, minor))
            .map(|m| m.options)
    };
    // The options as they are now, read before this returns: a remount made as soon as the
    // mount is reported (which comes after this) is a change the thread sees.
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut last =
        ours(&text).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the mount is gone"))?;
    std::thread::Builder::new()
        .name("lanefs-mountinfo".into())
        .spawn(move || {
            loop {
                let mut pfd = libc::pollfd {
                    fd: file.as_raw_fd(),
                    events: libc::POLLPRI,
                    revents: 0,
                };
                // SAFETY: pfd is a valid pollfd for the duration of the call.
                if unsafe { libc::poll(&mut pfd, 1, -1) } < 0
                    && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted
                {
                    return;
                }
                text.clear();
                if file.rewind().is_err() || file.read_to_string(&mut text).is_err() {
                    return;
                }
                let Some(options) = ours(&text) else { return };
                if options != last {
                    changed(&options);
                    last = options;
                }
            }
        })?;
    Ok(())
}

/// The mount at exactly `path`, the topmost one if several are stacked.
pub fn find_mount(path: &Path) -> io::Result<Option<MountInfo>> {
    Ok(mounts()?.into_iter().rfind(|info| info.mountpoint == path))
}

/// Every mount of this mount namespace, in mount order (a mount comes after the one it sits
/// on).
pub fn mounts() -> io::Result<Vec<MountInfo>> {
    let file = File::open("/proc/self/mountinfo")?;
    let mut all = Vec::new();
    for line in BufReader::new(file).lines() {
        if let Some(info) = parse_mountinfo_line(&line?) {
            all.push(info);
        }
    }
    Ok(all)
}

/// Makes a mount point absolute as mountinfo names it: its parent directory's real path
/// (symbolic links among the parents resolved: the kernel mounts on where they lead, and
/// mountinfo, by which the daemon, `stats` and `umount` find the mount, shows that) and its
/// own name, not touched (canonicalize would stat it: a dead mount answers ENOTCONN, a stuck
/// one hangs). A parent that cannot be resolved is normalised lexically.
pub fn absolute(path: &Path) -> io::Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    if let (Some(parent), Some(name)) = (joined.parent(), joined.file_name())
        && let Ok(parent) = parent.canonicalize()
    {
        return Ok(parent.join(name));
    }
    // Normalise `.` and `..` lexically, so /proc/self/mountinfo comparisons work.
    let mut out = PathBuf::from("/");
    for part in joined.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    Ok(out)
}

/// An error that says what failed and what to do.
fn explained(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

/// Checks a mount point before mounting: exists, is a directory, is not a (dead) FUSE mount.
pub fn check_mountpoint(mountpoint: &Path) -> io::Result<u32> {
    let shown = mountpoint.display();
    if let Some(info) = find_mount(mountpoint)?
        && info.fstype.starts_with("fuse")
    {
        // Look at it only through mountinfo: a stat could hang on a stuck server.
        let alive = std::fs::metadata(mountpoint);
        return Err(match alive {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => explained(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{shown} is a dead FUSE mount (Transport endpoint is not connected): its server is gone. Run `lanefs umount {shown}` (or `umount -l {shown}`), then mount again."
                ),
            ),
            _ => explained(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{shown} is already a FUSE mount ({} from {}): unmount it first with `lanefs umount {shown}`.",
                    info.fstype, info.source
                ),
            ),
        });
    }
    // A symbolic link would be followed by mount(2), and the mount then sit where mountinfo
    // does not name it by this path.
    if let Ok(meta) = std::fs::symlink_metadata(mountpoint)
        && meta.file_type().is_symlink()
    {
        let target = std::fs::canonicalize(mountpoint)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        return Err(explained(
            io::ErrorKind::InvalidInput,
            format!(
                "mount point {shown} is a symbolic link{target}: mount on the directory itself."
            ),
        ));
    }
    match std::fs::metadata(mountpoint) {
        Ok(meta) if meta.is_dir() => {
            use std::os::unix::fs::MetadataExt;
            Ok(meta.mode() & libc::S_IFMT)
        }
        Ok(_) => Err(explained(
            io::ErrorKind::InvalidInput,
            format!("mount point {shown} is not a directory: mount on a directory."),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(explained(
            io::ErrorKind::NotFound,
            format!("mount point {shown} does not exist: create it with `mkdir -p {shown}`."),
        )),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(explained(
            io::ErrorKind::AlreadyExists,
            format!(
                "{shown} is a dead FUSE mount (Transport endpoint is not connected): run `umount -l {shown}`, then mount again."
            ),
        )),
        Err(e) => Err(explained(
            e.kind(),
            format!("cannot use mount point {shown}: {e}"),
        )),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn cstring(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// Escapes a value for the comma-separated mount option string.
fn escape_option(value: &str) -> String {
    value.replace('\\', "\\\\").replace(',', "\\,")
}

/// Mounts and returns the session's /dev/fuse fd.
pub fn mount(spec: &MountSpec) -> io::Result<OwnedFd> {
    let root_mode = check_mountpoint(&spec.mountpoint)?;
    if is_root() {
        mount_direct(spec, root_mode)
    } else {
        mount_fusermount(spec)
    }
}

fn open_dev_fuse() -> io::Result<OwnedFd> {
    let path = c"/dev/fuse";
    // SAFETY: a valid NUL-terminated path; the returned fd is owned below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(explained(
            e.kind(),
            format!("cannot open /dev/fuse: {e} (is the fuse module loaded? `modprobe fuse`)"),
        ));
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mount_direct(spec: &MountSpec, root_mode: u32) -> io::Result<OwnedFd> {
    let fd = open_dev_fuse()?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={:o},user_id={uid},group_id={gid}",
        fd.as_raw_fd(),
        root_mode
    );
    if spec.allow_other {
        data.push_str(",allow_other");
    }
    if spec.default_permissions {
        data.push_str(",default_permissions");
    }
    let source = cstring(spec.fsname.as_bytes(), "the file system name")?;
    let target = cstring(spec.mountpoint.as_os_str().as_bytes(), "the mount point")?;
    // The caller's flags as they are: nosuid and nodev are its defaults, and root may ask for
    // suid and dev (device nodes and set-ID programs on the mount then work).
    let flags = spec.flags;
    let try_mount = |fstype: &str, data: &str| -> io::Result<()> {
        let fstype = cstring(fstype.as_bytes(), "the type")?;
        let data = cstring(data.as_bytes(), "the options")?;
        // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    match try_mount(FSTYPE, &data) {
        Ok(()) => Ok(fd),
        // Kernels without "fuse.subtype" types take the subtype as an option.
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
            try_mount("fuse", &format!("{data},subtype=lanefs"))
                .map(|()| fd)
                .map_err(|e| mount_error(spec, e))
        }
        Err(e) => Err(mount_error(spec, e)),
    }
}

fn mount_error(spec: &MountSpec, e: io::Error) -> io::Error {
    explained(
        e.kind(),
        format!(
            "mounting {} on {} failed: {e}",
            spec.fsname,
            spec.mountpoint.display()
        ),
    )
}

/// Mounts through the setuid helper fusermount3, which passes the fd back over a socket.
fn mount_fusermount(spec: &MountSpec) -> io::Result<OwnedFd> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints for socketpair to fill.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created by socketpair and are owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut opts = vec![
        format!("fsname={}", escape_option(&spec.fsname)),
        "subtype=lanefs".to_string(),
        "nosuid".to_string(),
        "nodev".to_string(),
    ];
    if spec.allow_other {
        opts.push("allow_other".into());
    }
    if spec.default_permissions {
        opts.push("default_permissions".into());
    }
    // The flags fusermount3 (3.14) passes to the kernel for a regular user; it always adds
    // nosuid and nodev itself.
    let mut dropped = Vec::new();
    for (flag, name) in FLAG_NAMES {
        if spec.flags & flag == 0 {
            continue;
        }
        if FUSERMOUNT_FLAGS.contains(name) {
            opts.push((*name).into());
        } else if !matches!(*name, "nosuid" | "nodev") {
            dropped.push(*name);
        }
    }
    if !dropped.is_empty() {
        tracing::warn!(
            "fusermount3 cannot set {} for a regular user: mounted without {}",
            dropped.join(","),
            if dropped.len() == 1 { "it" } else { "them" }
        );
    }
    // Its stderr is captured so that its reason reaches the user in daemon mode too.
    let output = Command::new("fusermount3")
        .arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(&spec.mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            explained(
                e.kind(),
                format!("cannot run fusermount3 to mount as a regular user: {e} (install the fuse3 package)"),
            )
        })?;
    drop(theirs);
    if !output.status.success() {
        let reason = String::from_utf8_lossy(&output.stderr);
        return Err(explained(
            io::ErrorKind::PermissionDenied,
            format!(
                "fusermount3 could not mount {} ({}): {}",
                spec.mountpoint.display(),
                output.status,
                reason.trim()
            ),
        ));
    }
    receive_fd(&ours)
}

/// MS_* flags and the option that sets each.
const FLAG_NAMES: &[(libc::c_ulong, &str)] = &[
    (libc::MS_RDONLY, "ro"),
    (libc::MS_NOSUID, "nosuid"),
    (libc::MS_NODEV, "nodev"),
    (libc::MS_NOEXEC, "noexec"),
    (libc::MS_NOATIME, "noatime"),
    (libc::MS_SYNCHRONOUS, "sync"),
    (libc::MS_DIRSYNC, "dirsync"),
    (libc::MS_NODIRATIME, "nodiratime"),
    (libc::MS_STRICTATIME, "strictatime"),
    (libc::MS_LAZYTIME, "lazytime"),
    (libc::MS_NOSYMFOLLOW, "nosymfollow"),
    (libc::MS_MANDLOCK, "mand"),
    (libc::MS_I_VERSION, "iversion"),
];

/// The mount flags fusermount3 3.14 knows (its `mount_flags` table, less the ones it refuses
/// to a regular user).
const FUSERMOUNT_FLAGS: &[&str] = &["ro", "noexec", "noatime", "sync", "dirsync"];

/// Changes the flags of the FUSE mount at `mountpoint` (mount(2) with MS_REMOUNT, as
/// mount(8) does for any file system): the mount's own flags (nosuid, nodev, noexec, atime)
/// and its superblock's (read-only, sync, ...). A read-only remount is refused by the kernel
/// (EBUSY) while files are open for writing, as for any file system.
pub fn remount(mountpoint: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let shown = mountpoint.display();
    match find_mount(mountpoint)? {
        Some(info) if info.fstype.starts_with("fuse") => {}
        Some(info) => {
            return Err(explained(
                io::ErrorKind::InvalidInput,
                format!("{shown} is a {} mount, not a FUSE one", info.fstype),
            ));
        }
        None => {
            return Err(explained(
                io::ErrorKind::NotFound,
                format!("{shown} is not a mount point: nothing to remount"),
            ));
        }
    }
    if !is_root() {
        return Err(explained(
            io::ErrorKind::PermissionDenied,
            format!(
                "remounting {shown} needs root (fusermount3 cannot change a mount's flags): unmount and mount it again"
            ),
        ));
    }
    let target = cstring(mountpoint.as_os_str().as_bytes(), "the mount point")?;
    // SAFETY: target is a valid NUL-terminated path; a remount reads no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let hint = if e.raw_os_error() == Some(libc::EBUSY) && flags & libc::MS_RDONLY != 0 {
        " (files are open for writing on it; close them first)"
    } else {
        ""
    };
    Err(explained(
        e.kind(),
        format!("remounting {shown} failed: {e}{hint}"),
    ))
}

/// Receives one fd sent with SCM_RIGHTS.
fn receive_fd(socket: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsg carrying one int, 8-byte aligned.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at live buffers sized as declared.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CMSG_FIRSTHDR reads msg's control fields that recvmsg filled.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: cmsg, when non-null, points into `control`.
    if cmsg.is_null() || unsafe { (*cmsg).cmsg_type } != libc::SCM_RIGHTS {
        return Err(io::Error::other(
            "fusermount3 did not pass the /dev/fuse fd back",
        ));
    }
    // SAFETY: an SCM_RIGHTS cmsg carries at least one int; read it unaligned to be safe.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()) };
    // SAFETY: the kernel installed this fd in our table for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// How long a plain unmount waits for a busy mount to become free before failing.
const UNMOUNT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
const UNMOUNT_BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Unmounts the mount at the top of `mountpoint` (UMOUNT_NOFOLLOW: a symlink at the path is
/// not followed). Lazily (`lazy`): the mount leaves the namespace now and the server sees the
/// connection end once the last open file on it is closed. Otherwise a busy mount is an error.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    if is_root() {
        let target = cstring(mountpoint.as_os_str().as_bytes(), "the mount point")?;
        let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
        let busy_since = std::time::Instant::now();
        // The mount found busy, read from mountinfo at the first EBUSY only.
        let mut busy_mount = None;
        let e = loop {
            // SAFETY: target is a valid NUL-terminated path.
            if unsafe { libc::umount2(target.as_ptr(), flags) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                break e;
            }
            // A reference that goes away by itself (a process between fork and exec holding
            // copies of fds opened on the mount, a close the kernel finishes later) makes a
            // mount busy for a moment: wait it out before calling it busy, as long as the
            // mount at the path is still the one we meant.
            let now = find_mount(mountpoint)?.map(|m| m.id);
            let same_mount = *busy_mount.get_or_insert(now) == now;
            if busy_since.elapsed() >= UNMOUNT_BUSY_WAIT || !same_mount {
                break e;
            }
            std::thread::sleep(UNMOUNT_BUSY_POLL);
        };
        let hint = if e.raw_os_error() == Some(libc::EBUSY) {
            " (files are open on it; close them, or unmount lazily with --lazy)"
        } else {
            ""
        };
        return Err(explained(
            e.kind(),
            format!("unmounting {} failed: {e}{hint}", mountpoint.display()),
        ));
    }
    let mut command = Command::new("fusermount3");
    command.arg("-u");
    if lazy {
        command.arg("-z");
    }
    let status = command.arg("--").arg(mountpoint).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u {} failed ({status})",
            mountpoint.display()
        )))
    }
}

/// Opens another queue on a session: a /dev/fuse fd cloned from the session's.
pub fn clone_queue_fd(session: RawFd) -> io::Result<OwnedFd> {
    let fd = open_dev_fuse()?;
    let session_id = session as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads a u32 fd number from the pointer, which is valid.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            crate::abi::FUSE_DEV_IOC_CLONE as _,
            &session_id as *const u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_optional_fields_and_escapes() {
        let line = "36 35 0:52 / /tmp/my\\040mnt rw,nosuid,nodev shared:1 master:2 - fuse.lanefs null: rw,user_id=0,group_id=0";
        let info = parse_mountinfo_line(line).unwrap();
        assert_eq!((info.id, info.parent), (36, 35));
        assert_eq!((info.major, info.minor), (0, 52));
        assert_eq!(info.mountpoint, PathBuf::from("/tmp/my mnt"));
        assert_eq!(info.fstype, "fuse.lanefs");
        assert_eq!(info.source, "null:");
        assert_eq!((info.id, info.parent), (36, 35));
        assert_eq!(info.options, "rw,nosuid,nodev");
        assert!(parse_mountinfo_line("garbage").is_none());
        assert!(parse_mountinfo_line("1 2 0:3 / /x rw").is_none());
    }

    #[test]
    fn absolute_normalises_lexically() {
        assert_eq!(
            absolute(Path::new("/a/./b/../c")).unwrap(),
            PathBuf::from("/a/c")
        );
        assert!(absolute(Path::new("rel")).unwrap().is_absolute());
    }

    #[test]
    fn option_values_are_escaped() {
        assert_eq!(escape_option("a,b\\c"), "a\\,b\\\\c");
    }

    #[test]
    fn mountpoint_errors_explain_themselves() {
        let dir = std::env::temp_dir().join(format!("lanefs-mount-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = check_mountpoint(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let e = check_mountpoint(&dir.join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mkdir -p"), "{e}");
        assert_eq!(check_mountpoint(&dir).unwrap(), libc::S_IFDIR);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
