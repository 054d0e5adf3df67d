//! The file-attribute ioctls the kernel forwards as FUSE_IOCTL (fs/fuse/ioctl.c,
//! `fuse_fileattr_get/set`), and the flags they carry: what `lsattr` shows and `chattr` sets.
//! The kernel's fileattr layer checks and forwards these four numbers; the 32-bit
//! FS_IOC32_GETFLAGS/SETFLAGS are translated for 32-bit callers only, so a 64-bit caller's
//! reach a server raw and unchecked, and servers answer them ENOTTY.

/// _IOR('f', 1, long) and _IOW('f', 2, long); the value is an int either way.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// _IOR('X', 31, struct fsxattr) and _IOW('X', 32, struct fsxattr).
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// struct fsxattr: fsx_xflags, fsx_extsize, fsx_nextents, fsx_projid, fsx_cowextsize, pad.
pub const FSXATTR_BYTES: usize = 28;

/// FS_*_FL, as FS_IOC_GETFLAGS carries them.
pub const FS_SYNC_FL: u32 = 0x08;
pub const FS_IMMUTABLE_FL: u32 = 0x10;
pub const FS_APPEND_FL: u32 = 0x20;
pub const FS_NODUMP_FL: u32 = 0x40;
pub const FS_NOATIME_FL: u32 = 0x80;

/// FS_XFLAG_*, as FS_IOC_FSGETXATTR carries them.
pub const FS_XFLAG_IMMUTABLE: u32 = 0x08;
pub const FS_XFLAG_APPEND: u32 = 0x10;
pub const FS_XFLAG_SYNC: u32 = 0x20;
pub const FS_XFLAG_NOATIME: u32 = 0x40;
pub const FS_XFLAG_NODUMP: u32 = 0x80;

/// Immutable and append-only: changing either needs CAP_LINUX_IMMUTABLE.
pub const GUARD_FLAGS: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL;

/// (FS_*_FL, FS_XFLAG_*) pairs of the flags both words carry.
const FLAG_PAIRS: [(u32, u32); 5] = [
    (FS_SYNC_FL, FS_XFLAG_SYNC),
    (FS_IMMUTABLE_FL, FS_XFLAG_IMMUTABLE),
    (FS_APPEND_FL, FS_XFLAG_APPEND),
    (FS_NODUMP_FL, FS_XFLAG_NODUMP),
    (FS_NOATIME_FL, FS_XFLAG_NOATIME),
];

/// FS_*_FL flags as FS_XFLAG_* (flags without a twin are dropped).
pub fn flags_to_xflags(flags: u32) -> u32 {
    FLAG_PAIRS
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// FS_XFLAG_* as FS_*_FL; None when `xflags` holds one without a twin.
pub fn xflags_to_flags(xflags: u32) -> Option<u32> {
    let known = FLAG_PAIRS.iter().fold(0, |all, (_, xf)| all | xf);
    (xflags & !known == 0).then(|| {
        FLAG_PAIRS
            .iter()
            .filter(|(_, xf)| xflags & xf != 0)
            .fold(0, |f, (fl, _)| f | fl)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_xflags_convert_both_ways() {
        let all = FS_SYNC_FL | GUARD_FLAGS | FS_NODUMP_FL | FS_NOATIME_FL;
        assert_eq!(flags_to_xflags(all), 0xf8);
        assert_eq!(xflags_to_flags(0xf8), Some(all));
        assert_eq!(xflags_to_flags(FS_XFLAG_APPEND), Some(FS_APPEND_FL));
        assert_eq!(xflags_to_flags(0x1), None, "FS_XFLAG_REALTIME has no flag");
    }
}
