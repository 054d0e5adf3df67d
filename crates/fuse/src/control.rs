//! The control socket of a mount: a Unix socket per mount, named after the mount's device
//! number, that answers each connection with the mount's statistics as one JSON document.
//! `lanefs stats MOUNTPOINT` finds the device number in /proc/self/mountinfo and connects.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
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
            std::fs::create_dir_all(dir)?;
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

/// Whether a daemon still listens on the control socket at `path`. A daemon that was killed
/// (or is a zombie waiting to be reaped) leaves its socket file behind with nobody
/// listening: connecting is refused at once.
pub fn daemon_listening(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Reads the statistics of a mount from its control socket.
pub fn query(mount: &MountInfo) -> io::Result<StatsSnapshot> {
    use std::io::Read;
    let path = socket_path(mount);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
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
    stream.read_to_end(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
