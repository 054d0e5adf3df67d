//! The control socket of a mount: a Unix socket per mount, named after the mount's device
//! number, that answers each connection with the mount's statistics as one JSON document.
//! `lanefs stats MOUNTPOINT` finds the device number in /proc/self/mountinfo and connects.
//!
//! The directory may sit in /tmp (`/tmp/lanefs-UID` when XDG_RUNTIME_DIR is unset: sudo,
//! cron, services), where another user can make it first and listen on the names we will
//! use. So the daemon and the clients use it only when it is a directory of their own user
//! that nobody else may enter, the clients talk only to a peer of their own user
//! (SO_PEERCRED), and read at most `ANSWER_MAX_BYTES` from it.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::mount::MountInfo;
use crate::stats::StatsSnapshot;

/// The directory holding control sockets: /run/lanefs for root, a per-user runtime
/// directory otherwise.
pub fn socket_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/lanefs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("lanefs"),
        _ => PathBuf::from(format!("/tmp/lanefs-{uid}")),
    }
}

/// The most a client reads from a control socket: a snapshot is tens of KiB.
const ANSWER_MAX_BYTES: u64 = 16 << 20;

/// Makes the socket directory (0700) if it is missing, and checks that it is ours alone:
/// a real directory (not a link to one) owned by this process's user. One of ours that
/// others may enter (made 0755 by an older lanefs, or by hand) is narrowed to 0700.
fn private_socket_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // /run/lanefs's or $XDG_RUNTIME_DIR's parent is missing: make the parents as
            // usual, the socket directory itself private.
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    // Ours and open to others (an older lanefs made it under umask 022 or 002): narrowed
    // first. Whatever listens in it then cannot fool a client (SO_PEERCRED), and our own
    // socket's name is unlinked before we bind it.
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    if meta.is_dir() && meta.uid() == unsafe { libc::geteuid() } && meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    check_socket_dir(dir)
}

/// The socket directory is a directory (not a link) of this process's user that no other
/// user may write to: otherwise whoever made it can put a listener of their own where a
/// client looks for the daemon's, or take the daemon's names.
fn check_socket_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of uid {me} (a {}, owned by uid {}, mode {:o}): another user may have made it; remove it or set XDG_RUNTIME_DIR",
                dir.display(),
                if meta.is_symlink() {
                    "symbolic link"
                } else if meta.is_dir() {
                    "directory"
                } else {
                    "file"
                },
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Connects to the control socket at `path`, in a directory that passes `check_socket_dir`,
/// and only to a listener of this process's user: the stream and the listener's pid.
fn connect(path: &Path) -> io::Result<(UnixStream, u32)> {
    if let Some(dir) = path.parent() {
        check_socket_dir(dir)?;
    }
    let stream = UnixStream::connect(path)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut peer = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `peer`, a ucred we own, and
    // stores the length it wrote in `len`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut peer).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if peer.uid != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {}, not by a lanefs daemon of uid {me}",
                path.display(),
                peer.uid
            ),
        ));
    }
    Ok((stream, peer.pid as u32))
}

/// The control socket of a mounted lanefs.
pub fn socket_path(mount: &MountInfo) -> PathBuf {
    socket_dir().join(format!("{}:{}.sock", mount.major, mount.minor))
}

/// A listening control socket; dropping it stops the listener and removes the file.
pub struct ControlSocket {
    path: PathBuf,
    /// The inode of the socket file we bound: the device number in its name is reused by the
    /// next mount as soon as ours is gone, so on the way out we remove the file only if it is
    /// still ours, never a newer daemon's.
    inode: u64,
    listener: UnixListener,
    thread: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// Listens on `path`, answering each connection with `snapshot()`.
    pub fn start(
        path: &Path,
        snapshot: impl Fn() -> StatsSnapshot + Send + 'static,
    ) -> io::Result<ControlSocket> {
        if let Some(dir) = path.parent() {
            private_socket_dir(dir)?;
        }
        // A socket left by a daemon that was killed: the device number is ours now.
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(path)?;
        let inode = std::fs::metadata(path)?.ino();
        let accepting = listener.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("lanefs-control".into())
            .spawn(move || {
                for stream in accepting.incoming() {
                    let Ok(mut stream) = stream else { break };
                    let body = serde_json::to_vec(&snapshot()).unwrap_or_default();
                    if let Err(e) = stream.write_all(&body) {
                        tracing::debug!("stats client went away: {e}");
                    }
                }
            })?;
        Ok(ControlSocket {
            path: path.to_owned(),
            inode,
            listener,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        // SAFETY: shutting down our own listening socket; on Linux this wakes accept(2).
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The daemon listening on the control socket at `path`, held by a pidfd (a pid could be
/// reused once it exits; a pidfd cannot), or None when nobody listens (a daemon that was
/// killed leaves its socket file behind: connecting is refused at once).
pub struct Daemon(std::os::fd::OwnedFd);

impl Daemon {
    pub fn of_socket(path: &Path) -> Option<Daemon> {
        use std::os::fd::FromRawFd;
        let (_, pid) = connect(path).ok()?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just returned by pidfd_open and is owned by nobody else.
        Some(Daemon(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd as i32)
        }))
    }

    /// Waits at most `timeout` for the daemon's process to exit: every file it held (its
    /// volume's database, intent log, data directory) is closed once it has; its control
    /// socket goes before its file system's files do. Whether it exited.
    pub fn wait_exit(&self, timeout: std::time::Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            // SAFETY: one pollfd we own, for the duration of the call.
            let n =
                unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            match n {
                1 => return true,
                0 => return false,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                _ => return false,
            }
        }
    }
}

/// Reads the statistics of a mount from its control socket.
pub fn query(mount: &MountInfo) -> io::Result<StatsSnapshot> {
    let path = socket_path(mount);
    let (stream, _) = connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot reach the lanefs daemon of {} at {}: {e}",
                mount.mountpoint.display(),
                path.display()
            ),
        )
    })?;
    let mut body = Vec::new();
    stream.take(ANSWER_MAX_BYTES).read_to_end(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
