//! The null file system: a root directory holding one file, `data`, whose reads return zeros
//! and whose writes are acknowledged and dropped. It measures the engine and the kernel's FUSE
//! path with no storage behind them (the "null" backend of the seeds' experiments).

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lanefs_fuse::abi::{self, fattr, fopen};
use lanefs_fuse::{DirBuffer, Filesystem, Reply, Request};

const ROOT: u64 = 1;
const DATA: u64 = 2;
const DATA_NAME: &str = "data";
/// Nothing about the null file system changes behind the kernel's back.
const CACHE_SECONDS: u64 = 3600;
/// Zeros for reads: a static page run in .bss, shared by every worker.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Options of the null file system.
#[derive(Debug, Clone)]
pub struct NullOptions {
    /// The apparent size of `data`.
    pub size: u64,
    /// Answer opens with FOPEN_PARALLEL_DIRECT_WRITES (seed 000's switch).
    pub parallel_writes: bool,
    /// Fault injection for the engine's tests: a lookup of this name panics in the handler.
    pub panic_on_lookup: Option<String>,
    /// For the engine's tests: answer each read from a thread of its own, after this long,
    /// as a file system that waits on something would, so the answer comes after the
    /// handler has returned (the request is parked meanwhile).
    pub defer_reads: Option<Duration>,
}

impl Default for NullOptions {
    fn default() -> Self {
        NullOptions {
            size: 1 << 40,
            parallel_writes: true,
            panic_on_lookup: None,
            defer_reads: None,
        }
    }
}

pub struct NullFs {
    options: NullOptions,
    /// The size of `data`: set by truncate, raised by writes past the end.
    size: AtomicU64,
    uid: u32,
    gid: u32,
    mounted_at: u64,
}

impl NullFs {
    pub fn new(options: NullOptions) -> Self {
        NullFs {
            size: AtomicU64::new(options.size),
            options,
            // SAFETY: getuid/getgid have no preconditions.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            mounted_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    fn attr(&self, ino: u64) -> Option<abi::Attr> {
        let (mode, nlink, size) = match ino {
            ROOT => (libc::S_IFDIR | 0o755, 2, 0),
            DATA => (libc::S_IFREG | 0o644, 1, self.size.load(Ordering::Relaxed)),
            _ => return None,
        };
        Some(abi::Attr {
            ino,
            size,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            mode,
            nlink,
            uid: self.uid,
            gid: self.gid,
            blksize: 4096,
            ..Default::default()
        })
    }

    fn reply_attr(&self, ino: u64, reply: Reply) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&abi::AttrOut {
                attr_valid: CACHE_SECONDS,
                attr,
                ..Default::default()
            }),
            None => reply.error(libc::ENOENT),
        }
    }
}

impl Filesystem for NullFs {
    fn lookup(&self, _req: &Request, parent: u64, name: &OsStr, reply: Reply) {
        if let Some(trap) = &self.options.panic_on_lookup
            && name == trap.as_str()
        {
            panic!("fault injection: lookup of {trap:?}");
        }
        if parent != ROOT || name != DATA_NAME {
            return reply.error(libc::ENOENT);
        }
        let attr = self.attr(DATA).expect("data always exists");
        reply.entry(&abi::EntryOut {
            nodeid: DATA,
            entry_valid: CACHE_SECONDS,
            attr_valid: CACHE_SECONDS,
            attr,
            ..Default::default()
        })
    }

    fn getattr(&self, _req: &Request, ino: u64, _fh: Option<u64>, reply: Reply) {
        self.reply_attr(ino, reply)
    }

    fn setattr(&self, _req: &Request, ino: u64, arg: &abi::SetattrIn, reply: Reply) {
        if arg.valid & fattr::SIZE != 0 {
            if ino != DATA {
                return reply.error(libc::EISDIR);
            }
            self.size.store(arg.size, Ordering::Relaxed);
        }
        // Mode, owner and times are accepted and forgotten, like the data.
        self.reply_attr(ino, reply)
    }

    fn open(&self, _req: &Request, ino: u64, _arg: &abi::OpenIn, reply: Reply) {
        if ino != DATA {
            return reply.error(libc::EISDIR);
        }
        let mut open_flags = fopen::DIRECT_IO;
        if self.options.parallel_writes {
            open_flags |= fopen::PARALLEL_DIRECT_WRITES;
        }
        reply.open(&abi::OpenOut {
            open_flags,
            ..Default::default()
        })
    }

    fn read(&self, _req: &Request, ino: u64, arg: &abi::ReadIn, reply: Reply) {
        if ino != DATA {
            return reply.error(libc::EISDIR);
        }
        let size = self.size.load(Ordering::Relaxed);
        let len = (arg.size as u64).min(size.saturating_sub(arg.offset)) as usize;
        if let Some(delay) = self.options.defer_reads {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                reply.data(&ZEROS[..len.min(ZEROS.len())])
            });
            return;
        }
        reply.data(&ZEROS[..len.min(ZEROS.len())])
    }

    fn write(&self, _req: &Request, ino: u64, arg: &abi::WriteIn, data: &[u8], reply: Reply) {
        if ino != DATA {
            return reply.error(libc::EISDIR);
        }
        self.size.fetch_max(
            arg.offset.saturating_add(data.len() as u64),
            Ordering::Relaxed,
        );
        reply.written(data.len() as u32)
    }

    fn flush(&self, _req: &Request, _ino: u64, _arg: &abi::FlushIn, reply: Reply) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: u64, _arg: &abi::FsyncIn, reply: Reply) {
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: u64, _arg: &abi::OpenIn, reply: Reply) {
        if ino != ROOT {
            return reply.error(libc::ENOTDIR);
        }
        reply.open(&abi::OpenOut::default())
    }

    fn readdir(&self, _req: &Request, ino: u64, arg: &abi::ReadIn, plus: bool, reply: Reply) {
        if ino != ROOT {
            return reply.error(libc::ENOTDIR);
        }
        let entries: [(u64, u32, &[u8]); 3] = [
            (ROOT, libc::DT_DIR as u32, b"."),
            (ROOT, libc::DT_DIR as u32, b".."),
            (DATA, libc::DT_REG as u32, DATA_NAME.as_bytes()),
        ];
        // Only `data` gets a lookup answer; the kernel handles . and .. itself.
        let entry_out = |_, ino| match ino {
            DATA => abi::EntryOut {
                nodeid: DATA,
                entry_valid: CACHE_SECONDS,
                attr_valid: CACHE_SECONDS,
                attr: self.attr(DATA).expect("data always exists"),
                ..Default::default()
            },
            _ => abi::EntryOut::default(),
        };
        let buf = DirBuffer::from_listing(
            arg.size as usize,
            entries,
            arg.offset,
            plus.then_some(entry_out),
        );
        reply.data(buf.as_bytes())
    }

    fn statfs(&self, _req: &Request, _ino: u64, reply: Reply) {
        let blocks = self.size.load(Ordering::Relaxed) / 4096;
        reply.statfs(&abi::Kstatfs {
            blocks,
            bfree: blocks,
            bavail: blocks,
            files: 2,
            ffree: 0,
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Default::default()
        })
    }
}
