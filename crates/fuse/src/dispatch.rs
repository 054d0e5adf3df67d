//! Serving one request: decode it, hand it to the file system's method, make sure it is
//! answered. Shared by every transport.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use crate::abi::{self, opcode};
use crate::filesystem::{Filesystem, Request};
use crate::reply::{QueueHandle, Reply, answered_during};
use crate::request::{self, DecodeError, Operation, WireFormat};

/// Whether a dispatched request was answered through its queue's sink, or will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatched {
    /// Answered before `dispatch` returned.
    Answered,
    /// Parked: the file system kept the `Reply` and answers later, from whichever thread.
    /// Over io_uring the request keeps its ring entry until then.
    Parked,
    /// No answer will come: FORGET, BATCH_FORGET, INTERRUPT, or a header too broken to answer.
    Silent,
}

/// Serves one request read into `buf`. `token` identifies the request to the queue's sink
/// (unused on /dev/fuse; the ring entry on io_uring). INIT never comes here: the session
/// answers it before any queue runs, and a second INIT is a protocol error.
pub fn dispatch<F: Filesystem>(
    fs: &F,
    wire: WireFormat,
    buf: &[u8],
    queue: &Arc<QueueHandle>,
    token: u64,
) -> Dispatched {
    let started = Instant::now();
    queue.stats.received();
    let (header, body) = match request::split_header(buf) {
        Ok(parts) => parts,
        Err(e) => {
            // Without a trustworthy header there is no unique to answer; the kernel never
            // sends such a request, so this is logged as the protocol bug it would be.
            tracing::error!("dropping malformed request: {e}");
            return Dispatched::Silent;
        }
    };
    let reply = || Reply::new(header.unique, token, header.opcode, started, queue.clone());
    let op = match request::decode(header.opcode, body, wire) {
        Ok(op) => op,
        Err(DecodeError::Unknown { .. }) => {
            reply().error(libc::ENOSYS);
            return Dispatched::Answered;
        }
        Err(e) => {
            tracing::warn!(unique = header.unique, "malformed request: {e}");
            reply().error(libc::EINVAL);
            return Dispatched::Answered;
        }
    };
    let req = Request {
        unique: header.unique,
        uid: header.uid,
        gid: header.gid,
        pid: header.pid,
        supp_group: header.supp_group,
        queue: queue.stats.id,
    };
    let ino = header.nodeid;
    // Answer-less operations are recorded here; the rest when their reply is sent.
    let record_silent = || queue.stats.record(header.opcode, started.elapsed(), false);
    let silent = matches!(
        op,
        Operation::Forget { .. } | Operation::BatchForget { .. } | Operation::Interrupt { .. }
    );
    let mut outcome = Ok(());
    let answered = answered_during(header.unique, || {
        outcome = catch_unwind(AssertUnwindSafe(|| serve(fs, &req, ino, op, reply)))
    });
    if outcome.is_err() {
        // The Reply moved into the handler was dropped while unwinding and answered EIO.
        tracing::error!(
            op = opcode::name(header.opcode),
            unique = header.unique,
            nodeid = ino,
            "file system handler panicked; the request was answered with EIO"
        );
    }
    if silent {
        record_silent();
        Dispatched::Silent
    } else if answered {
        Dispatched::Answered
    } else {
        Dispatched::Parked
    }
}

/// Calls the file system's method for `op`.
fn serve<F: Filesystem>(
    fs: &F,
    req: &Request,
    ino: u64,
    op: Operation<'_>,
    reply: impl Fn() -> Reply,
) {
    match op {
        Operation::Forget { nlookup } => fs.forget(ino, nlookup),
        Operation::BatchForget { nodes } => fs.batch_forget(nodes),
        // Handlers that finish promptly ignore it (their normal reply is accepted); one
        // that holds a request (a blocking lock) answers it EINTR.
        Operation::Interrupt { unique } => fs.interrupt(unique),
        Operation::Init { .. } => {
            tracing::warn!("second INIT on an initialised connection");
            reply().error(libc::EPROTO)
        }
        // The session calls `fs.destroy()` once every queue has stopped, DESTROY or not.
        Operation::Destroy => reply().ok(),
        Operation::Lookup { name } => fs.lookup(req, ino, name, reply()),
        Operation::Getattr { arg } => {
            let fh = (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh);
            fs.getattr(req, ino, fh, reply())
        }
        Operation::Setattr { arg } => fs.setattr(req, ino, arg, reply()),
        Operation::Readlink => fs.readlink(req, ino, reply()),
        Operation::Symlink { name, target } => fs.symlink(req, ino, name, target, reply()),
        Operation::Mknod { arg, name } => fs.mknod(req, ino, name, arg, reply()),
        Operation::Mkdir { arg, name } => fs.mkdir(req, ino, name, arg, reply()),
        Operation::Unlink { name } => fs.unlink(req, ino, name, reply()),
        Operation::Rmdir { name } => fs.rmdir(req, ino, name, reply()),
        Operation::Rename {
            newdir,
            flags,
            name,
            newname,
        } => fs.rename(req, ino, name, newdir, newname, flags, reply()),
        Operation::Link { oldnodeid, newname } => fs.link(req, oldnodeid, ino, newname, reply()),
        Operation::Open { arg } => fs.open(req, ino, arg, reply()),
        Operation::Read { arg } => fs.read(req, ino, arg, reply()),
        Operation::Write { arg, data } => fs.write(req, ino, arg, data, reply()),
        Operation::Statfs => fs.statfs(req, ino, reply()),
        Operation::Release { arg } => fs.release(req, ino, arg, reply()),
        Operation::Fsync { arg } => fs.fsync(req, ino, arg, reply()),
        Operation::Setxattr {
            name,
            value,
            flags,
            setxattr_flags,
        } => fs.setxattr(req, ino, name, value, flags, setxattr_flags, reply()),
        Operation::Getxattr { name, size } => fs.getxattr(req, ino, name, size, reply()),
        Operation::Listxattr { size } => fs.listxattr(req, ino, size, reply()),
        Operation::Removexattr { name } => fs.removexattr(req, ino, name, reply()),
        Operation::Flush { arg } => fs.flush(req, ino, arg, reply()),
        Operation::Opendir { arg } => fs.opendir(req, ino, arg, reply()),
        Operation::Readdir { arg } => fs.readdir(req, ino, arg, false, reply()),
        Operation::Readdirplus { arg } => fs.readdir(req, ino, arg, true, reply()),
        Operation::Releasedir { arg } => fs.releasedir(req, ino, arg, reply()),
        Operation::Fsyncdir { arg } => fs.fsyncdir(req, ino, arg, reply()),
        Operation::Getlk { arg } => fs.getlk(req, ino, arg, reply()),
        Operation::Setlk { arg, sleep } => fs.setlk(req, ino, arg, sleep, reply()),
        Operation::Access { mask } => fs.access(req, ino, mask, reply()),
        Operation::Create { arg, name } => fs.create(req, ino, name, arg, reply()),
        Operation::Tmpfile { arg } => fs.tmpfile(req, ino, arg, reply()),
        Operation::Fallocate { arg } => fs.fallocate(req, ino, arg, reply()),
        Operation::Lseek { arg } => fs.lseek(req, ino, arg, reply()),
        Operation::CopyFileRange { arg, .. } => fs.copy_file_range(req, ino, arg, reply()),
        Operation::Syncfs => fs.syncfs(req, ino, reply()),
        Operation::Ioctl { arg, data } => fs.ioctl(req, ino, arg, data, reply()),
    }
}
