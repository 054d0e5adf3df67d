//! Notifications a file system sends the kernel on its own (unique 0), written to the
//! session's /dev/fuse fd (`Connection::session_fd`): the kernel takes none over io_uring.

use std::os::fd::RawFd;

use zerocopy::IntoBytes;

use crate::abi::{NotifyInvalEntryOut, NotifyInvalInodeOut, OutHeader, notify};

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

/// Tells the kernel to forget the cached attributes and pages of `nodeid` (another mount of
/// a shared volume changed the file). ENOENT: the kernel does not know the inode.
pub fn inval_inode(session_fd: RawFd, nodeid: u64) -> std::io::Result<()> {
    let body = NotifyInvalInodeOut {
        ino: nodeid,
        off: 0,
        len: 0,
    };
    send(session_fd, notify::INVAL_INODE, body.as_bytes(), &[])
}

/// Tells the kernel to forget its cached entry `name` in directory `parent` (and the
/// directory's attributes). ENOENT: the kernel has no such entry cached.
pub fn inval_entry(session_fd: RawFd, parent: u64, name: &[u8]) -> std::io::Result<()> {
    let body = NotifyInvalEntryOut {
        parent,
        namelen: name.len() as u32,
        flags: 0,
    };
    // The name is NUL-terminated on the wire.
    send(
        session_fd,
        notify::INVAL_ENTRY,
        body.as_bytes(),
        &[name, b"\0"],
    )
}

/// Writes one notification: the header, `body`, then `tail`'s pieces, in one writev.
fn send(session_fd: RawFd, code: i32, body: &[u8], tail: &[&[u8]]) -> std::io::Result<()> {
    let len = size_of::<OutHeader>() + body.len() + tail.iter().map(|t| t.len()).sum::<usize>();
    let header = OutHeader {
        len: len as u32,
        error: code,
        unique: 0,
    };
    let mut iov = vec![
        libc::iovec {
            iov_base: header.as_bytes().as_ptr() as *mut libc::c_void,
            iov_len: size_of::<OutHeader>(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    iov.extend(tail.iter().map(|t| libc::iovec {
        iov_base: t.as_ptr() as *mut libc::c_void,
        iov_len: t.len(),
    }));
    // SAFETY: every iovec points at a live slice of its stated length that outlives the
    // call; writev only reads them.
    let written = unsafe { libc::writev(session_fd, iov.as_ptr(), iov.len() as i32) };
    if written < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}
