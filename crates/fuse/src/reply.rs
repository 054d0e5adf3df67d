//! Answering a request: the [`Reply`] handle and the encoding of each kind of answer.
//!
//! A `Reply` is `Send`: a file system may keep it and answer later from any thread. It routes
//! the answer to the queue its request came from (the kernel keeps a processing list per
//! /dev/fuse fd, and per io_uring entry). Every request is answered exactly once: the typed
//! methods consume the handle, and a handle dropped without an answer (a handler that forgot,
//! or one that panicked and unwound) answers EIO and logs it.

use std::cell::{Cell, RefCell};
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use zerocopy::IntoBytes;

use crate::abi::{self, opcode};
use crate::offload::Offload;
use crate::stats::QueueStats;

/// Where the replies of one queue go: the queue's /dev/fuse fd, or its io_uring ring.
pub trait ReplySink: Send + Sync {
    /// Writes one reply. `token` is what the transport put in the [`Reply`] (the io_uring
    /// entry, say). `iov[0]` is the out header; its `len` covers all slices.
    fn send(&self, token: u64, iov: &[IoSlice<'_>]) -> std::io::Result<()>;

    /// The buffer (start, length) the kernel will read the answer's payload from, when the
    /// transport has one per request (an io_uring entry's payload buffer), so that a read
    /// lands there without a second copy; None (the default, /dev/fuse): the answer is
    /// copied in by `send`. Only the one `Reply` of request `token` may write it, before it
    /// answers, and not after.
    fn payload_buffer(&self, token: u64) -> Option<(*mut u8, usize)> {
        let _ = token;
        None
    }

    /// Sends an answer whose payload (`payload_len` bytes) already lies at the start of
    /// `payload_buffer(token)`. `out_header` is the out header.
    fn send_in_place(
        &self,
        token: u64,
        out_header: &[u8],
        payload_len: usize,
    ) -> std::io::Result<()> {
        let _ = (token, out_header, payload_len);
        Err(std::io::Error::other(
            "this transport has no answer buffers to write into",
        ))
    }
}

/// One queue as seen by the replies of its requests.
pub struct QueueHandle {
    pub sink: Box<dyn ReplySink>,
    pub stats: QueueStats,
    /// Where `Reply::offload` sends slow work (the session's pools, one per NUMA node).
    pub offload: Arc<Offload>,
}

/// The handle that answers one request.
pub struct Reply {
    unique: u64,
    token: u64,
    opcode: u32,
    started: Instant,
    queue: Arc<QueueHandle>,
    answered: bool,
}

thread_local! {
    /// The request this thread is dispatching (its unique; 0: none) and whether its answer
    /// has been sent: how `dispatch` tells an answered request from a parked one.
    static DISPATCHING: Cell<(u64, bool)> = const { Cell::new((0, false)) };
    /// Per-thread read buffer for [`Reply::data_with`], so that reads allocate only once per
    /// thread, whichever thread answers.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Reply {
    pub(crate) fn new(
        unique: u64,
        token: u64,
        opcode: u32,
        started: Instant,
        queue: Arc<QueueHandle>,
    ) -> Self {
        Reply {
            unique,
            token,
            opcode,
            started,
            queue,
            answered: false,
        }
    }

    /// The opcode of the request this answers.
    pub fn opcode(&self) -> u32 {
        self.opcode
    }

    /// Runs `job`, which answers through this Reply, on the session's offload pool (a few
    /// threads per NUMA node, see `offload`): for work that can take long, so that it does
    /// not hold the queue's worker. When the pool is full it runs at once, here.
    pub fn offload(self, job: impl FnOnce(Reply) + Send + 'static) {
        let offload = self.queue.offload.clone();
        offload.run(move || job(self));
    }

    fn send(mut self, error: i32, payload: &[&[u8]]) {
        self.answered = true;
        send_raw(
            &self.queue,
            self.unique,
            self.token,
            self.opcode,
            self.started,
            error,
            payload,
        );
    }

    /// Answers with an error. `errno` is positive (libc::ENOENT); 0 is success with no data.
    pub fn error(self, errno: i32) {
        debug_assert!(errno >= 0);
        self.send(-errno, &[]);
    }

    /// Answers success with no data (flush, release, fsync, unlink, ...).
    pub fn ok(self) {
        self.send(0, &[]);
    }

    pub fn entry(self, entry: &abi::EntryOut) {
        self.send(0, &[entry.as_bytes()]);
    }

    pub fn attr(self, attr: &abi::AttrOut) {
        self.send(0, &[attr.as_bytes()]);
    }

    pub fn open(self, open: &abi::OpenOut) {
        self.send(0, &[open.as_bytes()]);
    }

    pub fn create(self, entry: &abi::EntryOut, open: &abi::OpenOut) {
        self.send(0, &[entry.as_bytes(), open.as_bytes()]);
    }

    /// Answers a read, readlink, readdir or xattr value with these bytes.
    pub fn data(self, data: &[u8]) {
        self.send(0, &[data]);
    }

    /// Answers with up to `max` bytes produced by `fill`, or with the errno `fill` returns.
    /// Over io_uring `fill` writes straight into the ring entry's payload buffer, which the
    /// kernel reads the answer from (no second copy); elsewhere into a per-thread buffer that
    /// is reused, so a read allocates nothing in steady state.
    pub fn data_with(mut self, max: usize, fill: impl FnOnce(&mut [u8]) -> Result<usize, i32>) {
        if let Some((at, len)) = self.queue.sink.payload_buffer(self.token) {
            // SAFETY: this Reply is the one of request `token` and has not answered, so the
            // buffer is its alone (see `ReplySink::payload_buffer`); the slice is not used
            // after the answer below.
            let buf = unsafe { std::slice::from_raw_parts_mut(at, len) };
            let max = max.min(buf.len());
            match fill(&mut buf[..max]) {
                Ok(n) => {
                    let n = n.min(max);
                    self.answered = true;
                    let header = abi::OutHeader {
                        len: (size_of::<abi::OutHeader>() + n) as u32,
                        error: 0,
                        unique: self.unique,
                    };
                    answering(&self.queue, self.unique, self.opcode, self.started, 0);
                    if let Err(e) = self
                        .queue
                        .sink
                        .send_in_place(self.token, header.as_bytes(), n)
                    {
                        send_failed(self.opcode, self.unique, &e);
                    }
                }
                Err(errno) => self.error(errno),
            }
            return;
        }
        READ_BUFFER.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < max {
                buf.resize(max, 0);
            }
            match fill(&mut buf[..max]) {
                Ok(n) => self.data(&buf[..n.min(max)]),
                Err(errno) => self.error(errno),
            }
        })
    }

    pub fn written(self, size: u32) {
        self.send(0, &[abi::WriteOut { size, padding: 0 }.as_bytes()]);
    }

    pub fn statfs(self, st: &abi::Kstatfs) {
        self.send(0, &[st.as_bytes()]);
    }

    /// Answers a size probe (getxattr or listxattr with size 0).
    pub fn xattr_size(self, size: u32) {
        self.send(0, &[abi::GetxattrOut { size, padding: 0 }.as_bytes()]);
    }

    pub fn lock(self, lk: &abi::FileLock) {
        self.send(0, &[abi::LkOut { lk: *lk }.as_bytes()]);
    }

    /// Answers an ioctl: its result (0 or more) and its output (at most the request's
    /// `out_size` bytes).
    pub fn ioctl(self, result: i32, out: &[u8]) {
        let head = abi::IoctlOut {
            result,
            ..Default::default()
        };
        self.send(0, &[head.as_bytes(), out]);
    }

    pub fn lseek(self, offset: u64) {
        self.send(0, &[abi::LseekOut { offset }.as_bytes()]);
    }

    /// Answers copy_file_range: COPY_FILE_RANGE_64 takes a u64, the older op a u32.
    pub fn copied(self, bytes: u64) {
        if self.opcode == opcode::COPY_FILE_RANGE_64 {
            self.send(
                0,
                &[abi::CopyFileRangeOut {
                    bytes_copied: bytes,
                }
                .as_bytes()],
            );
        } else {
            self.written(bytes.min(u32::MAX as u64) as u32);
        }
    }

    pub(crate) fn init(self, out: &abi::InitOut) {
        self.send(0, &[out.as_bytes()]);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.answered {
            tracing::error!(
                op = opcode::name(self.opcode),
                unique = self.unique,
                "request dropped without an answer (handler panicked or forgot): answering EIO"
            );
            self.answered = true;
            send_raw(
                &self.queue,
                self.unique,
                self.token,
                self.opcode,
                self.started,
                -libc::EIO,
                &[],
            );
        }
    }
}

/// Marks the request this thread is dispatching, if it is `unique`, as answered.
fn answered_now(unique: u64) {
    DISPATCHING.with(|d| {
        if d.get().0 == unique {
            d.set((unique, true));
        }
    });
}

/// Runs `serve` (which dispatches request `unique` on this thread) and says whether the
/// request was answered before it returned; false: its Reply was kept to answer later.
pub(crate) fn answered_during(unique: u64, serve: impl FnOnce()) -> bool {
    let outer = DISPATCHING.with(|d| d.replace((unique, false)));
    serve();
    DISPATCHING.with(|d| d.replace(outer)).1
}

fn send_raw(
    queue: &QueueHandle,
    unique: u64,
    token: u64,
    op: u32,
    started: Instant,
    error: i32,
    payload: &[&[u8]],
) {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let header = abi::OutHeader {
        len: (size_of::<abi::OutHeader>() + payload_len) as u32,
        error,
        unique,
    };
    let mut iov: [IoSlice<'_>; 4] = [IoSlice::new(&[]); 4];
    iov[0] = IoSlice::new(header.as_bytes());
    debug_assert!(payload.len() < iov.len());
    for (slot, part) in iov[1..].iter_mut().zip(payload) {
        *slot = IoSlice::new(part);
    }
    let count = 1 + payload.len().min(3);
    answering(queue, unique, op, started, error);
    if let Err(e) = queue.sink.send(token, &iov[..count]) {
        send_failed(op, unique, &e);
    }
}

/// What every answer records before it is sent: that this thread's dispatch of `unique`
/// answered it, and the op's count and latency (an error if `error` is not 0).
fn answering(queue: &QueueHandle, unique: u64, op: u32, started: Instant, error: i32) {
    answered_now(unique);
    queue.stats.record(op, started.elapsed(), error != 0);
}

/// An answer the kernel did not take. ENOENT is no error of ours: the kernel gave up on the
/// request (interrupted, or the caller was killed) and no longer expects it.
fn send_failed(op: u32, unique: u64, e: &std::io::Error) {
    if e.raw_os_error() == Some(libc::ENOENT) {
        tracing::debug!(
            op = opcode::name(op),
            unique,
            "answer to a request the kernel gave up on"
        );
    } else {
        tracing::warn!(op = opcode::name(op), unique, "sending reply failed: {e}");
    }
}

/// Sends a notification (unique 0) through a sink: a /dev/fuse one (`DevSink`), since the
/// kernel takes no notifications over io_uring (a ring's sink answers requests only).
pub fn notify(sink: &dyn ReplySink, code: i32, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let header = abi::OutHeader {
        len: (size_of::<abi::OutHeader>() + len) as u32,
        error: code,
        unique: 0,
    };
    let mut iov = vec![IoSlice::new(header.as_bytes())];
    iov.extend(parts.iter().map(|p| IoSlice::new(p)));
    sink.send(0, &iov)
}

/// Builds the body of a readdir or readdirplus answer, up to the size the kernel asked for.
pub struct DirBuffer {
    buf: Vec<u8>,
    max: usize,
}

/// What one directory entry contributes to an answer.
pub struct DirEntry<'a> {
    pub ino: u64,
    /// The offset the kernel passes back to continue after this entry.
    pub offset: u64,
    /// The file type as in d_type (DT_REG, ...).
    pub typ: u32,
    pub name: &'a [u8],
}

impl DirBuffer {
    pub fn new(max: usize) -> Self {
        DirBuffer {
            buf: Vec::with_capacity(max.min(1 << 20)),
            max,
        }
    }

    fn padded(len: usize) -> usize {
        (len + 7) & !7
    }

    /// Adds a readdir entry; false when it does not fit (the answer is then complete).
    pub fn push(&mut self, entry: &DirEntry<'_>) -> bool {
        self.append(Self::dirent(entry).as_bytes(), entry.name)
    }

    /// Adds a readdirplus entry with its lookup answer; false when it does not fit. An entry
    /// whose `nodeid` is 0 gives the kernel the name only (no lookup count is taken).
    pub fn push_plus(&mut self, entry: &DirEntry<'_>, entry_out: &abi::EntryOut) -> bool {
        let plus = abi::DirentPlus {
            entry_out: *entry_out,
            dirent: Self::dirent(entry),
        };
        self.append(plus.as_bytes(), entry.name)
    }

    /// The answer to a READDIR (`entry_out` None) or READDIRPLUS of at most `max` bytes
    /// from a listing held in memory, from its entry number `offset` on: entry `i` (ino,
    /// type, name) continues at offset `i + 1`, and `entry_out(i, ino)` is its lookup answer
    /// (nodeid 0: the name only).
    pub fn from_listing<'a>(
        max: usize,
        listing: impl IntoIterator<Item = (u64, u32, &'a [u8])>,
        offset: u64,
        mut entry_out: Option<impl FnMut(usize, u64) -> abi::EntryOut>,
    ) -> DirBuffer {
        let mut buf = DirBuffer::new(max);
        let entries = listing.into_iter().enumerate().skip(offset as usize);
        for (i, (ino, typ, name)) in entries {
            let entry = DirEntry {
                ino,
                offset: i as u64 + 1,
                typ,
                name,
            };
            let fits = match &mut entry_out {
                Some(entry_out) => buf.push_plus(&entry, &entry_out(i, ino)),
                None => buf.push(&entry),
            };
            if !fits {
                break;
            }
        }
        buf
    }

    fn dirent(entry: &DirEntry<'_>) -> abi::Dirent {
        abi::Dirent {
            ino: entry.ino,
            off: entry.offset,
            namelen: entry.name.len() as u32,
            typ: entry.typ,
        }
    }

    /// Appends a fixed part and its name, padded to 8 bytes, if it fits.
    fn append(&mut self, fixed: &[u8], name: &[u8]) -> bool {
        let len = fixed.len() + name.len();
        if self.buf.len() + Self::padded(len) > self.max {
            return false;
        }
        self.buf.extend_from_slice(fixed);
        self.buf.extend_from_slice(name);
        self.buf.resize(self.buf.len() + Self::padded(len) - len, 0);
        true
    }

    /// How many of these names' readdirplus entries, in order, fit in an answer of `max`
    /// bytes: the entries whose lookup answers a server has to find for it.
    pub fn plus_entries_fitting<'a>(
        max: usize,
        names: impl IntoIterator<Item = &'a [u8]>,
    ) -> usize {
        let mut len = 0;
        names
            .into_iter()
            .take_while(|name| {
                len += Self::padded(size_of::<abi::DirentPlus>() + name.len());
                len <= max
            })
            .count()
    }

    /// Whether room is left for at least one more entry of a name this long (plus or not).
    pub fn fits(&self, name_len: usize, plus: bool) -> bool {
        let fixed = if plus {
            size_of::<abi::DirentPlus>()
        } else {
            size_of::<abi::Dirent>()
        };
        self.buf.len() + Self::padded(fixed + name_len) <= self.max
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use zerocopy::FromBytes;

    /// Captures what a reply writes, as the kernel would read it.
    #[derive(Default)]
    struct Capture(Mutex<Vec<Vec<u8>>>);

    impl ReplySink for Arc<Capture> {
        fn send(&self, _token: u64, iov: &[IoSlice<'_>]) -> std::io::Result<()> {
            let bytes: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
            self.0.lock().unwrap().push(bytes);
            Ok(())
        }
    }

    fn reply(op: u32) -> (Reply, Arc<Capture>) {
        let capture = Arc::new(Capture::default());
        let queue = Arc::new(QueueHandle {
            sink: Box::new(capture.clone()),
            stats: QueueStats::new(0, None, None),
            offload: Arc::new(Offload::new(&crate::topology::Topology::single(1))),
        });
        (Reply::new(99, 0, op, Instant::now(), queue), capture)
    }

    fn only(capture: &Capture) -> (abi::OutHeader, Vec<u8>) {
        let sent = capture.0.lock().unwrap();
        assert_eq!(sent.len(), 1, "exactly one reply");
        let (header, body) = abi::OutHeader::read_from_prefix(&sent[0]).unwrap();
        assert_eq!(header.len as usize, sent[0].len());
        assert_eq!(header.unique, 99);
        (header, body.to_vec())
    }

    #[test]
    fn error_is_negative_errno_without_payload() {
        let (r, c) = reply(opcode::LOOKUP);
        r.error(libc::ENOENT);
        let (h, body) = only(&c);
        assert_eq!(h.error, -libc::ENOENT);
        assert!(body.is_empty());
    }

    #[test]
    fn entry_attr_open_create_encode_their_structs() {
        let entry = abi::EntryOut {
            nodeid: 5,
            attr: abi::Attr {
                ino: 5,
                size: 10,
                ..Default::default()
            },
            ..Default::default()
        };
        let (r, c) = reply(opcode::LOOKUP);
        r.entry(&entry);
        let (h, body) = only(&c);
        assert_eq!((h.error, body.len()), (0, 128));
        assert_eq!(abi::EntryOut::read_from_bytes(&body).unwrap().attr.size, 10);

        let (r, c) = reply(opcode::GETATTR);
        r.attr(&abi::AttrOut {
            attr_valid: 1,
            ..Default::default()
        });
        assert_eq!(only(&c).1.len(), 104);

        let (r, c) = reply(opcode::OPEN);
        r.open(&abi::OpenOut {
            fh: 3,
            open_flags: abi::fopen::DIRECT_IO,
            backing_id: 0,
        });
        let body = only(&c).1;
        assert_eq!(abi::OpenOut::read_from_bytes(&body).unwrap().fh, 3);

        let (r, c) = reply(opcode::CREATE);
        r.create(&entry, &abi::OpenOut::default());
        assert_eq!(only(&c).1.len(), 128 + 16);
    }

    #[test]
    fn data_and_small_replies() {
        let (r, c) = reply(opcode::READ);
        r.data(b"hello");
        assert_eq!(only(&c).1, b"hello");

        let (r, c) = reply(opcode::READ);
        r.data_with(8, |buf| {
            buf[..3].copy_from_slice(b"abc");
            Ok(3)
        });
        assert_eq!(only(&c).1, b"abc");

        let (r, c) = reply(opcode::READ);
        r.data_with(8, |_| Err(libc::EBADF));
        assert_eq!(only(&c).0.error, -libc::EBADF);

        let (r, c) = reply(opcode::WRITE);
        r.written(4096);
        assert_eq!(
            only(&c).1,
            4096u32
                .as_bytes()
                .iter()
                .chain(&[0u8; 4])
                .copied()
                .collect::<Vec<_>>()
        );

        let (r, c) = reply(opcode::GETXATTR);
        r.xattr_size(12);
        assert_eq!(only(&c).1.len(), 8);

        let (r, c) = reply(opcode::LSEEK);
        r.lseek(1 << 40);
        assert_eq!(only(&c).1, (1u64 << 40).to_ne_bytes());

        let (r, c) = reply(opcode::STATFS);
        r.statfs(&abi::Kstatfs::default());
        assert_eq!(only(&c).1.len(), 80);

        let (r, c) = reply(opcode::GETLK);
        r.lock(&abi::FileLock::default());
        assert_eq!(only(&c).1.len(), 24);
    }

    #[test]
    fn copy_file_range_width_follows_the_opcode() {
        let (r, c) = reply(opcode::COPY_FILE_RANGE);
        r.copied(5);
        assert_eq!(only(&c).1.len(), 8);
        let (r, c) = reply(opcode::COPY_FILE_RANGE_64);
        r.copied(1 << 33);
        assert_eq!(only(&c).1, (1u64 << 33).to_ne_bytes());
    }

    #[test]
    fn a_dropped_reply_answers_eio_once() {
        let (r, c) = reply(opcode::GETATTR);
        drop(r);
        assert_eq!(only(&c).0.error, -libc::EIO);
    }

    #[test]
    fn a_panicking_handler_still_answers_eio() {
        let (r, c) = reply(opcode::GETATTR);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _owned = r;
            panic!("handler bug");
        }));
        assert!(result.is_err());
        assert_eq!(only(&c).0.error, -libc::EIO);
    }

    #[test]
    fn dir_buffer_pads_entries_and_stops_when_full() {
        let mut dir = DirBuffer::new(64);
        assert!(dir.push(&DirEntry {
            ino: 1,
            offset: 1,
            typ: libc::DT_DIR as u32,
            name: b".",
        }));
        assert_eq!(dir.as_bytes().len(), 32);
        assert!(dir.push(&DirEntry {
            ino: 2,
            offset: 2,
            typ: libc::DT_REG as u32,
            name: b"datafile",
        }));
        assert_eq!(dir.as_bytes().len(), 64);
        assert!(!dir.fits(1, false));
        assert!(!dir.push(&DirEntry {
            ino: 3,
            offset: 3,
            typ: 0,
            name: b"x",
        }));
        let (first, _) = abi::Dirent::read_from_prefix(dir.as_bytes()).unwrap();
        assert_eq!((first.ino, first.namelen), (1, 1));
        let mut plus = DirBuffer::new(4096);
        assert!(plus.push_plus(
            &DirEntry {
                ino: 9,
                offset: 1,
                typ: 8,
                name: b"abc"
            },
            &abi::EntryOut::default()
        ));
        assert_eq!(plus.as_bytes().len(), 160);
    }

    #[test]
    fn plus_entries_fitting_counts_what_from_listing_fills() {
        let names: Vec<Vec<u8>> = (0..300).map(|i| vec![b'n'; 1 + i % 40]).collect();
        let listing = || {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (i as u64 + 1, 8, &n[..]))
        };
        for (max, offset) in [(4096, 0), (32768, 0), (32768, 150), (4096, 299), (100, 0)] {
            let fitting =
                DirBuffer::plus_entries_fitting(max, names[offset..].iter().map(|n| &n[..]));
            let mut asked = 0;
            let entry_out = Some(|_, ino| {
                asked += 1;
                abi::EntryOut {
                    nodeid: ino,
                    ..Default::default()
                }
            });
            let buf = DirBuffer::from_listing(max, listing(), offset as u64, entry_out);
            let mut filled = 0;
            let mut rest = buf.as_bytes();
            while let Ok((plus, _)) = abi::DirentPlus::read_from_prefix(rest) {
                filled += 1;
                rest =
                    &rest[DirBuffer::padded(size_of_val(&plus) + plus.dirent.namelen as usize)..];
            }
            assert_eq!(fitting, filled, "max {max}, offset {offset}");
            // from_listing asks for one answer past the last that fits, unless none is left.
            assert!(asked == filled || asked == filled + 1);
        }
    }
}
