//! Notifications a file system sends the kernel on its own (unique 0), written to the
//! session's /dev/fuse fd (`Connection::session_fd`): the kernel takes none over io_uring.

use std::os::fd::RawFd;

use zerocopy::IntoBytes;

use crate::abi::{NotifyInvalInodeOut, OutHeader, notify};

/// Tells the kernel to forget the cached attributes of `nodeid` (its cached pages stay): for
/// a change the kernel did not ask for and will not otherwise refetch. ENOENT: the kernel
/// does not know the inode, which is fine.
pub fn inval_inode_attrs(session_fd: RawFd, nodeid: u64) -> std::io::Result<()> {
    let body = NotifyInvalInodeOut {
        ino: nodeid,
        off: -1,
        len: 0,
    };
    let header = OutHeader {
        len: (size_of::<OutHeader>() + size_of::<NotifyInvalInodeOut>()) as u32,
        error: notify::INVAL_INODE,
        unique: 0,
    };
    let mut message = [0u8; size_of::<OutHeader>() + size_of::<NotifyInvalInodeOut>()];
    message[..size_of::<OutHeader>()].copy_from_slice(header.as_bytes());
    message[size_of::<OutHeader>()..].copy_from_slice(body.as_bytes());
    // SAFETY: message has message.len() readable bytes; writing to an fd has no other memory
    // effects.
    let written = unsafe { libc::write(session_fd, message.as_ptr().cast(), message.len()) };
    if written < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}
