//! The /dev/fuse transport: one fd per queue (the session's, or a clone), a worker that blocks
//! in read(2) on it, and replies written back with writev(2) on the same fd.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use crate::dispatch::dispatch;
use crate::filesystem::Filesystem;
use crate::reply::{QueueHandle, ReplySink};
use crate::request::WireFormat;

/// The reply side of a /dev/fuse queue.
pub struct DevSink {
    pub fd: Arc<OwnedFd>,
}

impl ReplySink for DevSink {
    fn send(&self, _token: u64, iov: &[IoSlice<'_>]) -> io::Result<()> {
        // SAFETY: IoSlice is ABI-compatible with struct iovec; the slices outlive the call.
        let written = unsafe {
            libc::writev(
                self.fd.as_raw_fd(),
                iov.as_ptr() as *const libc::iovec,
                iov.len() as libc::c_int,
            )
        };
        if written < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Why a queue's read failed, as far as the worker loop cares.
pub enum ReadOutcome {
    Request(usize),
    /// The kernel dropped the request we were about to read, or a signal came: read again.
    Retry,
    /// The connection is gone (unmounted or aborted): the queue is done.
    Ended,
}

/// Reads one request from a /dev/fuse fd into `buf`.
pub fn read_request(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<ReadOutcome> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(ReadOutcome::Request(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => Ok(ReadOutcome::Retry),
        Some(libc::ENODEV) => Ok(ReadOutcome::Ended),
        _ => Err(e),
    }
}

/// Serves one queue until its connection ends.
pub fn serve_queue<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    fd: &OwnedFd,
    queue: &Arc<QueueHandle>,
    buf: &mut [u8],
) -> io::Result<()> {
    loop {
        match read_request(fd, buf)? {
            ReadOutcome::Request(n) => dispatch(fs, wire, &buf[..n], queue, 0),
            ReadOutcome::Retry => continue,
            ReadOutcome::Ended => return Ok(()),
        }
    }
}
