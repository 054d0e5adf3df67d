//! Directories: opendir, readdir, readdirplus, fsyncdir. A listing reads the host's
//! `linux_dirent64` records with getdents64 and hands the kernel the host's own offsets
//! (d_off cookies), so a listing resumes exactly where the kernel asks, after seekdir too.

use std::os::fd::OwnedFd;

use lanefs_fuse::abi;
use lanefs_fuse::{DirBuffer, DirEntry};

use super::PassthroughFs;
use super::handle::OpenDir;
use super::sys::{self, SysResult};

/// Bytes of host records read at a time.
const DIRENT_BUFFER_BYTES: usize = 32 * 1024;
/// Offset of d_name in linux_dirent64 (u64 ino, i64 off, u16 reclen, u8 type).
const DIRENT_NAME_OFFSET: usize = 19;
/// A READDIRPLUS that would look up at most this many entries (the rest of a directory whose
/// end is already in our buffer) is answered on the worker even over io_uring: a few
/// lookups cost less than the handoff to the offload pool.
const READDIRPLUS_INLINE_MAX: usize = 32;
/// The longest linux_dirent64 record (a 255-byte name, header and padding): a getdents that
/// left more room than this in our buffer reached the end of the directory.
const DIRENT_MAX_BYTES: usize = 280;

/// Where an open directory's listing stands.
pub struct DirStream {
    fd: OwnedFd,
    /// Host records read but not yet handed to the kernel: `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The offset the kernel will pass to continue after what it has (the d_off of the last
    /// record handed over; 0 at the start).
    offset: u64,
    /// The last getdents left room in the buffer: the directory's end is in it.
    end_buffered: bool,
}

impl DirStream {
    /// Reads the next batch of host records into the buffer; the bytes read (0: the end).
    fn refill(&mut self) -> SysResult<usize> {
        if self.buf.is_empty() {
            self.buf = vec![0; DIRENT_BUFFER_BYTES];
        }
        let n = sys::getdents(&self.fd, &mut self.buf)?;
        self.start = 0;
        self.end = n;
        self.end_buffered = n + DIRENT_MAX_BYTES <= self.buf.len();
        Ok(n)
    }
}

/// One host record.
struct Record<'a> {
    ino: u64,
    next_offset: u64,
    typ: u8,
    name: &'a [u8],
    len: usize,
}

fn parse(buf: &[u8]) -> Option<Record<'_>> {
    let field = |at: usize, n: usize| buf.get(at..at + n);
    let ino = u64::from_ne_bytes(field(0, 8)?.try_into().ok()?);
    let next_offset = u64::from_ne_bytes(field(8, 8)?.try_into().ok()?);
    let len = u16::from_ne_bytes(field(16, 2)?.try_into().ok()?) as usize;
    let typ = *buf.get(18)?;
    let name_area = buf.get(DIRENT_NAME_OFFSET..len)?;
    let name_len = name_area.iter().position(|&b| b == 0)?;
    Some(Record {
        ino,
        next_offset,
        typ,
        name: &name_area[..name_len],
        len,
    })
}

impl PassthroughFs {
    pub(super) fn do_opendir(&self, ino: u64) -> SysResult<abi::OpenOut> {
        let inode = self.inode(ino)?;
        let fd = self.open_inode(
            &inode,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        let fh = self.dirs.insert(OpenDir {
            inode,
            stream: std::sync::Mutex::new(DirStream {
                fd,
                buf: Vec::new(),
                start: 0,
                end: 0,
                offset: 0,
                end_buffered: false,
            }),
        });
        Ok(abi::OpenOut {
            fh,
            ..Default::default()
        })
    }

    pub(super) fn do_readdir(&self, arg: &abi::ReadIn, plus: bool) -> SysResult<DirBuffer> {
        let dir = self.dirs.get(arg.fh).ok_or(libc::EBADF)?;
        let mut stream = dir.stream.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *stream;
        if arg.offset != s.offset {
            sys::lseek(&s.fd, arg.offset, libc::SEEK_SET)?;
            s.start = 0;
            s.end = 0;
            s.offset = arg.offset;
        }
        let mut out = DirBuffer::new(arg.size as usize);
        loop {
            if s.start >= s.end {
                match s.refill() {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if out.as_bytes().is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            let Some(record) = parse(&s.buf[s.start..s.end]) else {
                // A record we cannot read: drop the rest of this batch.
                s.start = s.end;
                continue;
            };
            if !out.fits(record.name.len(), plus) {
                break;
            }
            let entry = DirEntry {
                // As getattr shows it (a mount point's shows the covered directory's, as
                // natively).
                ino: super::inode::shown_ino(dir.inode.dev_tag, record.ino),
                offset: record.next_offset,
                typ: record.typ as u32,
                name: record.name,
            };
            if plus {
                let dot = record.name == b"." || record.name == b"..";
                // The kernel resolves . and .. itself; others get a lookup answer, or only
                // their name if they vanished meanwhile (nodeid 0 takes no lookup count).
                let looked_up = if dot {
                    None
                } else {
                    let name = std::ffi::CString::new(record.name).map_err(|_| libc::EIO)?;
                    self.lookup_child(&dir.inode, &name).ok()
                };
                out.push_plus(&entry, &looked_up.unwrap_or_default());
            } else {
                out.push(&entry);
            }
            s.start += record.len;
            s.offset = record.next_offset;
        }
        Ok(out)
    }

    /// Whether a READDIRPLUS would look up few entries (`READDIRPLUS_INLINE_MAX`): the
    /// directory's remaining records, up to its end, are in our buffer (read now with one
    /// getdents if the buffer is empty, which costs no lookup). A seek, or a directory whose
    /// end is not yet buffered, counts as large.
    pub(super) fn readdirplus_is_small(&self, arg: &abi::ReadIn) -> bool {
        let Some(dir) = self.dirs.get(arg.fh) else {
            return true;
        };
        let mut stream = dir.stream.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *stream;
        if arg.offset != s.offset {
            return false;
        }
        if s.start >= s.end && !matches!(s.refill(), Ok(n) if n > 0) {
            // The end, or an error: answered at once either way.
            return true;
        }
        if !s.end_buffered {
            return false;
        }
        let mut records = 0;
        let mut at = s.start;
        while let Some(record) = s.buf.get(at..s.end).and_then(parse) {
            records += 1;
            if records > READDIRPLUS_INLINE_MAX {
                return false;
            }
            at += record.len;
        }
        true
    }

    pub(super) fn do_fsyncdir(&self, arg: &abi::FsyncIn) -> SysResult<()> {
        let dir = self.dirs.get(arg.fh).ok_or(libc::EBADF)?;
        let stream = dir.stream.lock().unwrap_or_else(|e| e.into_inner());
        sys::fsync(&stream.fd, arg.fsync_flags & abi::FSYNC_FDATASYNC != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_linux_dirent64() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&42u64.to_ne_bytes());
        rec.extend_from_slice(&7u64.to_ne_bytes());
        rec.extend_from_slice(&24u16.to_ne_bytes());
        rec.push(libc::DT_REG);
        rec.extend_from_slice(b"abc\0");
        rec.resize(24, 0);
        let r = parse(&rec).unwrap();
        assert_eq!(
            (r.ino, r.next_offset, r.len, r.name),
            (42, 7, 24, &b"abc"[..])
        );
        assert!(parse(&rec[..10]).is_none());
    }
}
