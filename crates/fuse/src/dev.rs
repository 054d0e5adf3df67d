//! The /dev/fuse transport: one fd per queue (the session's, or a clone), a worker that blocks
//! in read(2) on it, and replies written back with writev(2) on the same fd.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// What a read from a queue gave, as far as the worker loop cares.
pub enum ReadOutcome {
    Request(usize),
    /// The kernel dropped the request we were about to read, or a signal came: read again.
    Retry,
    /// Nothing queued (non-blocking fd).
    Empty,
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
        Some(libc::ENOENT | libc::EINTR) => Ok(ReadOutcome::Retry),
        Some(libc::EAGAIN) => Ok(ReadOutcome::Empty),
        Some(libc::ENODEV) => Ok(ReadOutcome::Ended),
        _ => Err(e),
    }
}

/// Polling of idle queues: at most one worker of a session polls at a time, so a mount with
/// many queues keeps one awake worker, not a CPU's worth of them.
pub struct PollPolicy {
    /// How long an idle worker polls before sleeping; zero turns polling off.
    pub window: Duration,
    /// Held by the worker that is polling now. Touched only when a worker goes idle, never per
    /// request.
    pub poller: AtomicBool,
}

/// Serves one queue until its connection ends.
///
/// With a polling window, an idle worker keeps reading without sleeping for that long after
/// its last request before it blocks. A worker that is awake when a request arrives saves the
/// sleep/wake-up pair on the server side of every round trip, which is most of a small
/// request's latency on a virtual machine; once the queue is idle it sleeps as usual.
pub fn serve_queue<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    fd: &OwnedFd,
    queue: &Arc<QueueHandle>,
    buf: &mut [u8],
    poll: &PollPolicy,
) -> io::Result<()> {
    if !poll.window.is_zero() {
        set_nonblocking(fd)?;
    }
    // Some(start) while this worker holds the poller token.
    let mut polling_since: Option<Instant> = None;
    let release = |since: &mut Option<Instant>| {
        if since.take().is_some() {
            poll.poller.store(false, Ordering::Release);
        }
    };
    let result = loop {
        match read_request(fd, buf) {
            Ok(ReadOutcome::Request(n)) => {
                release(&mut polling_since);
                // /dev/fuse needs nothing back: a reply is a writev on the same fd.
                let _ = dispatch(fs, wire, &buf[..n], queue, 0);
            }
            Ok(ReadOutcome::Retry) => continue,
            Ok(ReadOutcome::Empty) => {
                if polling_since.is_none()
                    && poll
                        .poller
                        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    polling_since = Some(Instant::now());
                }
                match polling_since {
                    Some(since) if since.elapsed() < poll.window => {
                        // Yield rather than spin: on a busy CPU the callers we wait for run
                        // instead of us; on an idle one this returns at once.
                        // SAFETY: sched_yield has no preconditions.
                        unsafe { libc::sched_yield() };
                    }
                    _ => {
                        release(&mut polling_since);
                        if let Err(e) = wait_readable(fd) {
                            break Err(e);
                        }
                    }
                }
            }
            Ok(ReadOutcome::Ended) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    release(&mut polling_since);
    result
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sleeps until the queue has a request (or the connection ends: the read then says so).
fn wait_readable(fd: &OwnedFd) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    Ok(())
}
