//! Decoding a request read from the kernel into an [`Operation`] that borrows from the read
//! buffer. Write payloads, names and xattr values are slices of that buffer: nothing is copied.
//!
//! Architecture invariant: no I/O, no allocation, no panic on any input (a malformed request
//! is a [`DecodeError`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use zerocopy::{FromBytes, Immutable, KnownLayout};

use crate::abi::{self, opcode};

/// Who sent a request, copied out of its header.
#[derive(Debug, Clone, Copy)]
pub struct RequestHeader {
    pub unique: u64,
    pub opcode: u32,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The one supplementary group of the caller the kernel vouches for (FUSE_EXT_GROUPS, with
    /// CREATE_SUPP_GROUP negotiated): on create, mkdir, mknod, symlink and tmpfile, the parent
    /// directory's group when the caller is in it other than as its fsgid.
    pub supp_group: Option<u32>,
}

/// The extension type of a supplementary-group list (uapi `FUSE_EXT_GROUPS`).
const EXT_GROUPS: u32 = 32;
/// Extensions are records of 8-byte multiples: `fuse_ext_header { u32 size; u32 type; }`,
/// `size` counting the header.
const EXT_HEADER_BYTES: usize = 8;

/// The first group of a `FUSE_EXT_GROUPS` extension in `ext` (the extension area after the
/// op's arguments), if any. A malformed area (the kernel never sends one) yields None: acting
/// with fewer groups only ever refuses more.
fn supp_group(mut ext: &[u8]) -> Option<u32> {
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    while ext.len() >= EXT_HEADER_BYTES {
        let size = word(ext, 0)? as usize;
        if size < EXT_HEADER_BYTES || !size.is_multiple_of(8) || size > ext.len() {
            return None;
        }
        if word(ext, 4)? == EXT_GROUPS {
            // fuse_supp_groups { u32 nr_groups; u32 groups[]; }
            let record = &ext[EXT_HEADER_BYTES..size];
            return (word(record, 0)? >= 1).then(|| word(record, 4)).flatten();
        }
        ext = &ext[size..];
    }
    None
}

/// Why a request could not be decoded. The session answers EINVAL (or ENOSYS) and logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a fuse_in_header, or the header's length disagrees with what was read.
    BadLength { read: usize, header_len: u32 },
    /// The op's argument struct or a name runs past the end of the request.
    Truncated { opcode: u32 },
    /// A name is not NUL-terminated or is empty.
    BadName { opcode: u32 },
    /// An opcode we do not implement: the answer is ENOSYS.
    Unknown { opcode: u32 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::BadLength { read, header_len } => {
                write!(f, "request of {read} bytes has header length {header_len}")
            }
            DecodeError::Truncated { opcode } => {
                write!(f, "{} request is truncated", opcode::name(*opcode))
            }
            DecodeError::BadName { opcode } => {
                write!(f, "{} request has a malformed name", opcode::name(*opcode))
            }
            DecodeError::Unknown { opcode } => write!(f, "unsupported opcode {opcode}"),
        }
    }
}

/// One decoded request. Names are without their NUL terminator.
#[derive(Debug)]
pub enum Operation<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        nodes: &'a [abi::ForgetOne],
    },
    Getattr {
        arg: &'a abi::GetattrIn,
    },
    Setattr {
        arg: &'a abi::SetattrIn,
    },
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        arg: &'a abi::MknodIn,
        name: &'a OsStr,
    },
    Mkdir {
        arg: &'a abi::MkdirIn,
        name: &'a OsStr,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        arg: &'a abi::OpenIn,
    },
    Read {
        arg: &'a abi::ReadIn,
    },
    Write {
        arg: &'a abi::WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release {
        arg: &'a abi::ReleaseIn,
    },
    Fsync {
        arg: &'a abi::FsyncIn,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: u32,
        setxattr_flags: u32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        arg: &'a abi::FlushIn,
    },
    Init {
        arg: abi::InitIn,
    },
    Opendir {
        arg: &'a abi::OpenIn,
    },
    Readdir {
        arg: &'a abi::ReadIn,
    },
    Readdirplus {
        arg: &'a abi::ReadIn,
    },
    Releasedir {
        arg: &'a abi::ReleaseIn,
    },
    Fsyncdir {
        arg: &'a abi::FsyncIn,
    },
    Getlk {
        arg: &'a abi::LkIn,
    },
    Setlk {
        arg: &'a abi::LkIn,
        sleep: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        arg: &'a abi::CreateIn,
        name: &'a OsStr,
    },
    Tmpfile {
        arg: &'a abi::CreateIn,
    },
    Interrupt {
        unique: u64,
    },
    Destroy,
    Fallocate {
        arg: &'a abi::FallocateIn,
    },
    Lseek {
        arg: &'a abi::LseekIn,
    },
    CopyFileRange {
        arg: &'a abi::CopyFileRangeIn,
        wide: bool,
    },
    Syncfs,
    Ioctl {
        arg: &'a abi::IoctlIn,
        /// The `in_size` bytes of input.
        data: &'a [u8],
    },
}

/// Reads the op's fixed argument struct and the bytes after it.
struct Cursor<'a> {
    rest: &'a [u8],
    opcode: u32,
}

impl<'a> Cursor<'a> {
    fn arg<T: FromBytes + KnownLayout + Immutable>(&mut self) -> Result<&'a T, DecodeError> {
        let (value, rest) = T::ref_from_prefix(self.rest).map_err(|_| DecodeError::Truncated {
            opcode: self.opcode,
        })?;
        self.rest = rest;
        Ok(value)
    }

    /// A NUL-terminated, non-empty name.
    fn name(&mut self) -> Result<&'a OsStr, DecodeError> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::BadName {
                opcode: self.opcode,
            })?;
        if end == 0 {
            return Err(DecodeError::BadName {
                opcode: self.opcode,
            });
        }
        let name = OsStr::from_bytes(&self.rest[..end]);
        self.rest = &self.rest[end + 1..];
        Ok(name)
    }

    fn bytes(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < len {
            return Err(DecodeError::Truncated {
                opcode: self.opcode,
            });
        }
        let (head, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(head)
    }
}

/// Options of the connection that change how requests are laid out.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireFormat {
    /// SETXATTR_EXT was negotiated: fuse_setxattr_in is 16 bytes, not 8.
    pub setxattr_ext: bool,
}

/// Splits a request into its header and its op-specific bytes (extensions stripped).
pub fn split_header(buf: &[u8]) -> Result<(RequestHeader, &[u8]), DecodeError> {
    let bad_length = |header_len| DecodeError::BadLength {
        read: buf.len(),
        header_len,
    };
    let (header, _) = abi::InHeader::ref_from_prefix(buf).map_err(|_| bad_length(0))?;
    let len = header.len as usize;
    if len < size_of::<abi::InHeader>() || len != buf.len() {
        return Err(bad_length(header.len));
    }
    // Extensions (security context, supplementary groups) follow the op's arguments: they
    // are split off so they never look like part of the args.
    let ext_len = header.total_extlen as usize * 8;
    let body_end = len
        .checked_sub(ext_len)
        .filter(|&end| end >= size_of::<abi::InHeader>())
        .ok_or_else(|| bad_length(header.len))?;
    let request_header = RequestHeader {
        unique: header.unique,
        opcode: header.opcode,
        nodeid: header.nodeid,
        uid: header.uid,
        gid: header.gid,
        pid: header.pid,
        supp_group: supp_group(&buf[body_end..len]),
    };
    Ok((request_header, &buf[size_of::<abi::InHeader>()..body_end]))
}

/// Decodes the op-specific bytes of a request (after [`split_header`]).
pub fn decode(opcode: u32, body: &[u8], wire: WireFormat) -> Result<Operation<'_>, DecodeError> {
    let mut c = Cursor { rest: body, opcode };
    let op = match opcode {
        opcode::LOOKUP => Operation::Lookup { name: c.name()? },
        opcode::FORGET => Operation::Forget {
            nlookup: c.arg::<abi::ForgetIn>()?.nlookup,
        },
        opcode::BATCH_FORGET => {
            let count = c.arg::<abi::BatchForgetIn>()?.count as usize;
            let bytes = c.bytes(count.saturating_mul(size_of::<abi::ForgetOne>()))?;
            let nodes = <[abi::ForgetOne]>::ref_from_bytes(bytes)
                .map_err(|_| DecodeError::Truncated { opcode })?;
            Operation::BatchForget { nodes }
        }
        opcode::GETATTR => Operation::Getattr { arg: c.arg()? },
        opcode::SETATTR => Operation::Setattr { arg: c.arg()? },
        opcode::READLINK => Operation::Readlink,
        opcode::SYMLINK => {
            let name = c.name()?;
            let target = c.name()?;
            Operation::Symlink { name, target }
        }
        opcode::MKNOD => {
            let arg = c.arg()?;
            Operation::Mknod {
                arg,
                name: c.name()?,
            }
        }
        opcode::MKDIR => {
            let arg = c.arg()?;
            Operation::Mkdir {
                arg,
                name: c.name()?,
            }
        }
        opcode::UNLINK => Operation::Unlink { name: c.name()? },
        opcode::RMDIR => Operation::Rmdir { name: c.name()? },
        opcode::RENAME => {
            let newdir = c.arg::<abi::RenameIn>()?.newdir;
            let name = c.name()?;
            let newname = c.name()?;
            Operation::Rename {
                newdir,
                flags: 0,
                name,
                newname,
            }
        }
        opcode::RENAME2 => {
            let arg = c.arg::<abi::Rename2In>()?;
            let name = c.name()?;
            let newname = c.name()?;
            Operation::Rename {
                newdir: arg.newdir,
                flags: arg.flags,
                name,
                newname,
            }
        }
        opcode::LINK => {
            let oldnodeid = c.arg::<abi::LinkIn>()?.oldnodeid;
            Operation::Link {
                oldnodeid,
                newname: c.name()?,
            }
        }
        opcode::OPEN => Operation::Open { arg: c.arg()? },
        opcode::READ => Operation::Read { arg: c.arg()? },
        opcode::WRITE => {
            let arg: &abi::WriteIn = c.arg()?;
            let data = c.bytes(arg.size as usize)?;
            Operation::Write { arg, data }
        }
        opcode::STATFS => Operation::Statfs,
        opcode::RELEASE => Operation::Release { arg: c.arg()? },
        opcode::FSYNC => Operation::Fsync { arg: c.arg()? },
        opcode::SETXATTR => {
            let (size, flags, setxattr_flags) = if wire.setxattr_ext {
                let arg = c.arg::<abi::SetxattrIn>()?;
                (arg.size, arg.flags, arg.setxattr_flags)
            } else {
                let arg = c.arg::<abi::GetxattrIn>()?; // same 8-byte layout: size, flags
                (arg.size, arg.padding, 0)
            };
            let name = c.name()?;
            let value = c.bytes(size as usize)?;
            Operation::Setxattr {
                name,
                value,
                flags,
                setxattr_flags,
            }
        }
        opcode::GETXATTR => {
            let size = c.arg::<abi::GetxattrIn>()?.size;
            Operation::Getxattr {
                name: c.name()?,
                size,
            }
        }
        opcode::LISTXATTR => Operation::Listxattr {
            size: c.arg::<abi::GetxattrIn>()?.size,
        },
        opcode::REMOVEXATTR => Operation::Removexattr { name: c.name()? },
        opcode::FLUSH => Operation::Flush { arg: c.arg()? },
        opcode::INIT => {
            // Kernels before 7.36 send only the first 16 bytes.
            let mut arg = abi::InitIn::default();
            let n = body.len().min(size_of::<abi::InitIn>());
            if n < abi::COMPAT_INIT_IN_SIZE {
                return Err(DecodeError::Truncated { opcode });
            }
            zerocopy::IntoBytes::as_mut_bytes(&mut arg)[..n].copy_from_slice(&body[..n]);
            Operation::Init { arg }
        }
        opcode::OPENDIR => Operation::Opendir { arg: c.arg()? },
        opcode::READDIR => Operation::Readdir { arg: c.arg()? },
        opcode::READDIRPLUS => Operation::Readdirplus { arg: c.arg()? },
        opcode::RELEASEDIR => Operation::Releasedir { arg: c.arg()? },
        opcode::FSYNCDIR => Operation::Fsyncdir { arg: c.arg()? },
        opcode::GETLK => Operation::Getlk { arg: c.arg()? },
        opcode::SETLK => Operation::Setlk {
            arg: c.arg()?,
            sleep: false,
        },
        opcode::SETLKW => Operation::Setlk {
            arg: c.arg()?,
            sleep: true,
        },
        opcode::ACCESS => Operation::Access {
            mask: c.arg::<abi::AccessIn>()?.mask,
        },
        opcode::CREATE => {
            let arg = c.arg()?;
            Operation::Create {
                arg,
                name: c.name()?,
            }
        }
        opcode::TMPFILE => Operation::Tmpfile { arg: c.arg()? },
        opcode::INTERRUPT => Operation::Interrupt {
            unique: c.arg::<abi::InterruptIn>()?.unique,
        },
        opcode::DESTROY => Operation::Destroy,
        opcode::FALLOCATE => Operation::Fallocate { arg: c.arg()? },
        opcode::LSEEK => Operation::Lseek { arg: c.arg()? },
        opcode::COPY_FILE_RANGE => Operation::CopyFileRange {
            arg: c.arg()?,
            wide: false,
        },
        opcode::COPY_FILE_RANGE_64 => Operation::CopyFileRange {
            arg: c.arg()?,
            wide: true,
        },
        opcode::SYNCFS => Operation::Syncfs,
        opcode::IOCTL => {
            let arg: &abi::IoctlIn = c.arg()?;
            let data = c.bytes(arg.in_size as usize)?;
            Operation::Ioctl { arg, data }
        }
        _ => return Err(DecodeError::Unknown { opcode }),
    };
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn request(opcode: u32, body: &[u8]) -> Vec<u8> {
        let header = abi::InHeader {
            len: (size_of::<abi::InHeader>() + body.len()) as u32,
            opcode,
            unique: 7,
            nodeid: 42,
            uid: 1000,
            gid: 100,
            pid: 99,
            total_extlen: 0,
            padding: 0,
        };
        let mut buf = header.as_bytes().to_vec();
        buf.extend_from_slice(body);
        buf
    }

    fn decode_one(opcode: u32, body: &[u8]) -> Result<Operation<'static>, DecodeError> {
        let buf: &'static [u8] = Box::leak(request(opcode, body).into_boxed_slice());
        let (header, body) = split_header(buf)?;
        assert_eq!(header.unique, 7);
        assert_eq!(header.nodeid, 42);
        assert_eq!((header.uid, header.gid, header.pid), (1000, 100, 99));
        decode(header.opcode, body, WireFormat::default())
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn header_shorter_than_its_struct_is_rejected() {
        assert!(matches!(
            split_header(&[0u8; 39]),
            Err(DecodeError::BadLength { .. })
        ));
    }

    #[test]
    fn header_length_past_the_read_is_rejected() {
        let mut buf = request(opcode::GETATTR, &[0u8; 16]);
        buf[0] = 200;
        assert!(matches!(
            split_header(&buf),
            Err(DecodeError::BadLength { .. })
        ));
    }

    #[test]
    fn extensions_are_stripped_from_the_body() {
        let mut buf = request(opcode::LOOKUP, b"name\0\x01\x02\x03\x04\x05\x06\x07\x08");
        buf[36] = 1; // total_extlen = 1 (8 bytes)
        let (header, body) = split_header(&buf).unwrap();
        assert_eq!(body, b"name\0");
        assert_eq!(header.supp_group, None);
    }

    #[test]
    fn the_supplementary_group_extension_is_decoded() {
        // name (8 bytes with padding), then fuse_ext_header { size 16, type 32 } and
        // fuse_supp_groups { nr_groups 1, groups[0] 1234 }.
        let mut body = b"name\0\0\0\0".to_vec();
        for word in [16u32, EXT_GROUPS, 1, 1234] {
            body.extend_from_slice(&word.to_ne_bytes());
        }
        let mut buf = request(opcode::MKDIR, &body);
        buf[36] = 2; // total_extlen: 16 bytes
        let (header, body) = split_header(&buf).unwrap();
        assert_eq!(header.supp_group, Some(1234));
        assert_eq!(body, b"name\0\0\0\0");
        // Another extension first (a security context, type 1) is skipped over.
        assert_eq!(
            supp_group(
                &[8u32, 1, 16, EXT_GROUPS, 1, 77]
                    .map(u32::to_ne_bytes)
                    .concat()
            ),
            Some(77)
        );
        // Malformed areas give no group and never panic.
        for bad in [
            vec![0u32, EXT_GROUPS],
            vec![12, EXT_GROUPS, 1],
            vec![24, EXT_GROUPS, 1, 5],
            vec![16, EXT_GROUPS, 0, 5],
        ] {
            let bytes: Vec<u8> = bad.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert_eq!(supp_group(&bytes), None, "{bad:?}");
        }
    }

    #[test]
    fn lookup() {
        let Operation::Lookup { name } = decode_one(opcode::LOOKUP, b"hello\0").unwrap() else {
            panic!()
        };
        assert_eq!(name, "hello");
    }

    #[test]
    fn lookup_without_nul_is_bad_name() {
        assert_eq!(
            decode_one(opcode::LOOKUP, b"hello").unwrap_err(),
            DecodeError::BadName {
                opcode: opcode::LOOKUP
            }
        );
        assert!(decode_one(opcode::LOOKUP, b"\0").is_err());
    }

    #[test]
    fn forget_and_batch_forget() {
        let Operation::Forget { nlookup } =
            decode_one(opcode::FORGET, abi::ForgetIn { nlookup: 3 }.as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(nlookup, 3);
        let body = cat(&[
            abi::BatchForgetIn { count: 2, dummy: 0 }.as_bytes(),
            abi::ForgetOne {
                nodeid: 5,
                nlookup: 1,
            }
            .as_bytes(),
            abi::ForgetOne {
                nodeid: 6,
                nlookup: 2,
            }
            .as_bytes(),
        ]);
        let Operation::BatchForget { nodes } = decode_one(opcode::BATCH_FORGET, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!(nodes.len(), 2);
        assert_eq!((nodes[1].nodeid, nodes[1].nlookup), (6, 2));
        // A count larger than the payload is truncated, not a panic.
        let short = cat(&[abi::BatchForgetIn { count: 9, dummy: 0 }.as_bytes()]);
        assert!(decode_one(opcode::BATCH_FORGET, &short).is_err());
        let huge = cat(&[abi::BatchForgetIn {
            count: u32::MAX,
            dummy: 0,
        }
        .as_bytes()]);
        assert!(decode_one(opcode::BATCH_FORGET, &huge).is_err());
    }

    #[test]
    fn getattr_setattr() {
        let arg = abi::GetattrIn {
            getattr_flags: abi::GETATTR_FH,
            dummy: 0,
            fh: 9,
        };
        let Operation::Getattr { arg: got } = decode_one(opcode::GETATTR, arg.as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(got.fh, 9);
        let arg = abi::SetattrIn {
            valid: abi::fattr::SIZE,
            size: 1234,
            ..Default::default()
        };
        let Operation::Setattr { arg: got } = decode_one(opcode::SETATTR, arg.as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!((got.valid, got.size), (abi::fattr::SIZE, 1234));
        assert!(decode_one(opcode::SETATTR, &[0u8; 87]).is_err());
    }

    #[test]
    fn symlink_mknod_mkdir() {
        let Operation::Symlink { name, target } =
            decode_one(opcode::SYMLINK, b"link\0/target/path\0").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (name.as_bytes(), target.as_bytes()),
            (&b"link"[..], &b"/target/path"[..])
        );
        let body = cat(&[
            abi::MknodIn {
                mode: 0o10644,
                rdev: 0,
                umask: 0o22,
                padding: 0,
            }
            .as_bytes(),
            b"fifo\0",
        ]);
        let Operation::Mknod { arg, name } = decode_one(opcode::MKNOD, &body).unwrap() else {
            panic!()
        };
        assert_eq!(
            (arg.mode, arg.umask, name.as_bytes()),
            (0o10644, 0o22, &b"fifo"[..])
        );
        let body = cat(&[
            abi::MkdirIn {
                mode: 0o755,
                umask: 0,
            }
            .as_bytes(),
            b"d\0",
        ]);
        let Operation::Mkdir { arg, name } = decode_one(opcode::MKDIR, &body).unwrap() else {
            panic!()
        };
        assert_eq!((arg.mode, name.as_bytes()), (0o755, &b"d"[..]));
    }

    #[test]
    fn unlink_rmdir_rename_link() {
        assert!(matches!(
            decode_one(opcode::UNLINK, b"f\0").unwrap(),
            Operation::Unlink { .. }
        ));
        assert!(matches!(
            decode_one(opcode::RMDIR, b"d\0").unwrap(),
            Operation::Rmdir { .. }
        ));
        let body = cat(&[abi::RenameIn { newdir: 3 }.as_bytes(), b"a\0b\0"]);
        let Operation::Rename {
            newdir,
            flags,
            name,
            newname,
        } = decode_one(opcode::RENAME, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (newdir, flags, name.as_bytes(), newname.as_bytes()),
            (3, 0, &b"a"[..], &b"b"[..])
        );
        let body = cat(&[
            abi::Rename2In {
                newdir: 4,
                flags: libc::RENAME_EXCHANGE,
                padding: 0,
            }
            .as_bytes(),
            b"a\0b\0",
        ]);
        let Operation::Rename { newdir, flags, .. } = decode_one(opcode::RENAME2, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!((newdir, flags), (4, libc::RENAME_EXCHANGE));
        let body = cat(&[abi::RenameIn { newdir: 3 }.as_bytes(), b"a\0"]);
        assert!(decode_one(opcode::RENAME, &body).is_err());
        let body = cat(&[abi::LinkIn { oldnodeid: 8 }.as_bytes(), b"hard\0"]);
        let Operation::Link { oldnodeid, newname } = decode_one(opcode::LINK, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!((oldnodeid, newname.as_bytes()), (8, &b"hard"[..]));
    }

    #[test]
    fn open_read_write_without_copying_the_payload() {
        let arg = abi::OpenIn {
            flags: libc::O_RDWR as u32,
            open_flags: 0,
        };
        assert!(matches!(
            decode_one(opcode::OPEN, arg.as_bytes()).unwrap(),
            Operation::Open { .. }
        ));
        let arg = abi::ReadIn {
            fh: 1,
            offset: 4096,
            size: 512,
            ..Default::default()
        };
        let Operation::Read { arg: got } = decode_one(opcode::READ, arg.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!((got.offset, got.size), (4096, 512));
        let arg = abi::WriteIn {
            fh: 1,
            offset: 10,
            size: 5,
            ..Default::default()
        };
        let buf = request(opcode::WRITE, &cat(&[arg.as_bytes(), b"abcde"]));
        let (header, body) = split_header(&buf).unwrap();
        let Operation::Write { arg: got, data } =
            decode(header.opcode, body, WireFormat::default()).unwrap()
        else {
            panic!()
        };
        assert_eq!((got.offset, data), (10, &b"abcde"[..]));
        // The payload points into the read buffer.
        let payload_start = buf.len() - 5;
        assert_eq!(data.as_ptr(), buf[payload_start..].as_ptr());
        // A size larger than the payload is truncated.
        let arg = abi::WriteIn {
            size: 6,
            ..Default::default()
        };
        assert!(decode_one(opcode::WRITE, &cat(&[arg.as_bytes(), b"abcde"])).is_err());
    }

    #[test]
    fn xattrs_in_both_setxattr_layouts() {
        let body = cat(&[
            abi::GetxattrIn {
                size: 3,
                padding: libc::XATTR_CREATE as u32,
            }
            .as_bytes(),
            b"user.a\0xyz",
        ]);
        let Operation::Setxattr {
            name, value, flags, ..
        } = decode_one(opcode::SETXATTR, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (name.as_bytes(), value, flags),
            (&b"user.a"[..], &b"xyz"[..], libc::XATTR_CREATE as u32)
        );
        let body = cat(&[
            abi::SetxattrIn {
                size: 2,
                flags: 0,
                setxattr_flags: abi::SETXATTR_ACL_KILL_SGID,
                padding: 0,
            }
            .as_bytes(),
            b"user.b\0hi",
        ]);
        let buf = request(opcode::SETXATTR, &body);
        let (_, body) = split_header(&buf).unwrap();
        let Operation::Setxattr {
            value,
            setxattr_flags,
            ..
        } = decode(opcode::SETXATTR, body, WireFormat { setxattr_ext: true }).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (value, setxattr_flags),
            (&b"hi"[..], abi::SETXATTR_ACL_KILL_SGID)
        );
        let body = cat(&[
            abi::GetxattrIn {
                size: 0,
                padding: 0,
            }
            .as_bytes(),
            b"user.a\0",
        ]);
        let Operation::Getxattr { name, size } = decode_one(opcode::GETXATTR, &body).unwrap()
        else {
            panic!()
        };
        assert_eq!((name.as_bytes(), size), (&b"user.a"[..], 0));
        let body = abi::GetxattrIn {
            size: 100,
            padding: 0,
        };
        let Operation::Listxattr { size } = decode_one(opcode::LISTXATTR, body.as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(size, 100);
        assert!(matches!(
            decode_one(opcode::REMOVEXATTR, b"user.a\0").unwrap(),
            Operation::Removexattr { .. }
        ));
    }

    #[test]
    fn init_accepts_the_short_pre_7_36_layout() {
        let full = abi::InitIn {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: 1,
            flags2: 2,
            unused: [0; 11],
        };
        let Operation::Init { arg } = decode_one(opcode::INIT, full.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!((arg.minor, arg.flags2), (45, 2));
        let Operation::Init { arg } = decode_one(opcode::INIT, &full.as_bytes()[..16]).unwrap()
        else {
            panic!()
        };
        assert_eq!((arg.minor, arg.flags, arg.flags2), (45, 1, 0));
        assert!(decode_one(opcode::INIT, &full.as_bytes()[..8]).is_err());
    }

    #[test]
    fn directory_lock_and_misc_ops() {
        let read = abi::ReadIn::default();
        for op in [opcode::READDIR, opcode::READDIRPLUS] {
            assert!(decode_one(op, read.as_bytes()).is_ok());
        }
        let release = abi::ReleaseIn::default();
        assert!(decode_one(opcode::RELEASEDIR, release.as_bytes()).is_ok());
        assert!(decode_one(opcode::RELEASE, release.as_bytes()).is_ok());
        let fsync = abi::FsyncIn::default();
        assert!(decode_one(opcode::FSYNC, fsync.as_bytes()).is_ok());
        assert!(decode_one(opcode::FSYNCDIR, fsync.as_bytes()).is_ok());
        let lk = abi::LkIn::default();
        assert!(matches!(
            decode_one(opcode::SETLKW, lk.as_bytes()).unwrap(),
            Operation::Setlk { sleep: true, .. }
        ));
        assert!(matches!(
            decode_one(opcode::SETLK, lk.as_bytes()).unwrap(),
            Operation::Setlk { sleep: false, .. }
        ));
        assert!(decode_one(opcode::GETLK, lk.as_bytes()).is_ok());
        let access = abi::AccessIn {
            mask: 4,
            padding: 0,
        };
        assert!(matches!(
            decode_one(opcode::ACCESS, access.as_bytes()).unwrap(),
            Operation::Access { mask: 4 }
        ));
        let create = abi::CreateIn::default();
        assert!(matches!(
            decode_one(opcode::CREATE, &cat(&[create.as_bytes(), b"new\0"])).unwrap(),
            Operation::Create { .. }
        ));
        assert!(decode_one(opcode::TMPFILE, create.as_bytes()).is_ok());
        let interrupt = abi::InterruptIn { unique: 77 };
        assert!(matches!(
            decode_one(opcode::INTERRUPT, interrupt.as_bytes()).unwrap(),
            Operation::Interrupt { unique: 77 }
        ));
        assert!(decode_one(opcode::FALLOCATE, abi::FallocateIn::default().as_bytes()).is_ok());
        assert!(decode_one(opcode::LSEEK, abi::LseekIn::default().as_bytes()).is_ok());
        let cfr = abi::CopyFileRangeIn::default();
        assert!(matches!(
            decode_one(opcode::COPY_FILE_RANGE_64, cfr.as_bytes()).unwrap(),
            Operation::CopyFileRange { wide: true, .. }
        ));
        assert!(matches!(
            decode_one(opcode::STATFS, b"").unwrap(),
            Operation::Statfs
        ));
        assert!(matches!(
            decode_one(opcode::DESTROY, b"").unwrap(),
            Operation::Destroy
        ));
        assert!(matches!(
            decode_one(opcode::READLINK, b"").unwrap(),
            Operation::Readlink
        ));
        assert!(decode_one(opcode::FLUSH, abi::FlushIn::default().as_bytes()).is_ok());
        assert!(decode_one(opcode::OPENDIR, abi::OpenIn::default().as_bytes()).is_ok());
    }

    #[test]
    fn unknown_opcode_is_enosys_material() {
        assert_eq!(
            decode_one(9999, b"").unwrap_err(),
            DecodeError::Unknown { opcode: 9999 }
        );
        assert_eq!(
            decode_one(opcode::POLL, b"").unwrap_err(),
            DecodeError::Unknown {
                opcode: opcode::POLL
            }
        );
    }

    #[test]
    fn ioctl_carries_its_input() {
        let arg = abi::IoctlIn {
            fh: 3,
            flags: abi::ioctl_flags::DIR,
            cmd: 0x4004_6602,
            arg: 0,
            in_size: 4,
            out_size: 0,
        };
        let body = cat(&[arg.as_bytes(), &[1, 2, 3, 4]]);
        let Operation::Ioctl { arg: got, data } = decode_one(opcode::IOCTL, &body).unwrap() else {
            panic!()
        };
        assert_eq!(
            (got.fh, got.cmd, data),
            (3, 0x4004_6602, &[1u8, 2, 3, 4][..])
        );
        // Input shorter than in_size is truncated, not read past.
        assert!(decode_one(opcode::IOCTL, &body[..body.len() - 1]).is_err());
    }

    #[test]
    fn every_truncation_of_every_known_op_is_an_error_not_a_panic() {
        let big = vec![0x41u8; 256];
        for op in 0..opcode::COUNT as u32 + 2 {
            for len in 0..big.len() {
                let _ = decode_one(op, &big[..len]);
            }
        }
    }
}
