//! POSIX ACLs, which the volume keeps as the two xattrs the kernel reads and writes
//! (FUSE_POSIX_ACL): the kernel checks permissions with them, and leaves to the file system
//! what a local file system does itself: a new inode's ACL and mode from its directory's
//! default ACL (`inherit`), the mode that setting an access ACL implies (`mode_bits`), and
//! the access ACL that a chmod implies (`chmod`). The rules are the kernel's own
//! (posix_acl_create, posix_acl_update_mode, posix_acl_chmod), so that a volume answers as
//! ext4 or tmpfs would.
//!
//! The value is the kernel's xattr form: a little-endian u32 version (2), then one
//! 8-byte entry per (tag u16, perm u16, id u32), sorted by tag and id, which the kernel
//! validated before sending it.

use crate::meta::Errno;

pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// Whether `name` is one of the two ACL xattrs.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// An xattr's name and value.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// A parsed ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// EINVAL for anything that is not a well-formed ACL with its three required entries
    /// (the kernel sends only those; a damaged row must not be taken for one).
    pub fn parse(value: &[u8]) -> Result<Acl, Errno> {
        if value.len() < HEADER_BYTES || !(value.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
            return Err(libc::EINVAL);
        }
        let version = u32::from_le_bytes(value[..HEADER_BYTES].try_into().unwrap_or_default());
        if version != VERSION {
            return Err(libc::EINVAL);
        }
        let entries: Vec<Entry> = value[HEADER_BYTES..]
            .chunks_exact(ENTRY_BYTES)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]) & 0o7,
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let count = |tag| entries.iter().filter(|e| e.tag == tag).count();
        let named = count(USER) + count(GROUP);
        let valid_tags = entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER));
        if !valid_tags
            || count(USER_OBJ) != 1
            || count(GROUP_OBJ) != 1
            || count(OTHER) != 1
            || count(MASK) > 1
            || (named > 0 && count(MASK) == 0)
        {
            return Err(libc::EINVAL);
        }
        Ok(Acl { entries })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// More than the three entries a mode says (posix_acl_equiv_mode's "not equivalent").
    fn extended(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.tag, USER | GROUP | MASK))
    }

    fn perm(&self, tag: u16) -> u32 {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map_or(0, |e| e.perm as u32)
    }

    /// The permission bits (0o777) this ACL gives the mode: the owner's, the mask's (or
    /// the owning group's when there is no mask) and the others'.
    fn bits(&self) -> u32 {
        let group = if self.entries.iter().any(|e| e.tag == MASK) {
            self.perm(MASK)
        } else {
            self.perm(GROUP_OBJ)
        };
        self.perm(USER_OBJ) << 6 | group << 3 | self.perm(OTHER)
    }
}

/// What setting `value` as an inode's access ACL does (posix_acl_update_mode): the
/// permission bits its mode takes, and whether the ACL is kept (false: it says no more
/// than those bits, and is stored as no ACL at all, as ext4 does).
pub fn mode_bits(value: &[u8]) -> Result<(u32, bool), Errno> {
    let acl = Acl::parse(value)?;
    Ok((acl.bits(), acl.extended()))
}

/// The access ACL after a chmod to `mode` (posix_acl_chmod): the owner's, the mask's (or
/// the owning group's) and the others' entries follow the new bits; named entries stay.
/// None when `value` is no ACL (a damaged row is left as it is).
pub fn chmod(value: &[u8], mode: u32) -> Option<Vec<u8>> {
    let mut acl = Acl::parse(value).ok()?;
    let has_mask = acl.entries.iter().any(|e| e.tag == MASK);
    for e in &mut acl.entries {
        let bits = match e.tag {
            USER_OBJ => mode >> 6,
            GROUP_OBJ if !has_mask => mode >> 3,
            MASK => mode >> 3,
            OTHER => mode,
            _ => continue,
        };
        e.perm = (bits & 0o7) as u16;
    }
    Some(acl.to_bytes())
}

/// A new inode's mode and ACL xattrs in a directory whose default ACL is `default`
/// (posix_acl_create): with one, the requested mode is masked by it (the umask does not
/// apply), the inode gets it as its access ACL unless the mode says as much, and a new
/// directory gets it as its own default too; without one, the umask applies. `mode` has
/// its type bits; symlinks get neither (their mode is always 0o777).
pub fn inherit(default: Option<&[u8]>, mode: u32, umask: u32) -> (u32, Vec<Xattr>) {
    let kind = mode & libc::S_IFMT;
    if kind == libc::S_IFLNK {
        return (mode, Vec::new());
    }
    let Some(acl) = default.and_then(|d| Acl::parse(d).ok()) else {
        return (mode & !(umask & 0o777), Vec::new());
    };
    let mut access = acl.clone();
    let mut bits = mode & 0o777;
    let has_mask = access.entries.iter().any(|e| e.tag == MASK);
    for e in &mut access.entries {
        let shift = match e.tag {
            USER_OBJ => 6,
            GROUP_OBJ if !has_mask => 3,
            MASK => 3,
            OTHER => 0,
            _ => continue,
        };
        e.perm &= ((bits >> shift) & 0o7) as u16;
    }
    bits = access.bits();
    let mut xattrs = Vec::new();
    if access.extended() {
        xattrs.push((ACCESS_XATTR.to_vec(), access.to_bytes()));
    }
    if kind == libc::S_IFDIR {
        xattrs.push((DEFAULT_XATTR.to_vec(), acl.to_bytes()));
    }
    ((mode & !0o777) | bits, xattrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| Entry { tag, perm, id })
                .collect(),
        }
        .to_bytes()
    }

    const NONE: u32 = u32::MAX;

    #[test]
    fn a_minimal_acl_says_no_more_than_the_mode() {
        let v = acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 0, NONE)]);
        assert_eq!(mode_bits(&v), Ok((0o640, false)));
    }

    #[test]
    fn the_mask_stands_for_the_group_bits() {
        let v = acl(&[
            (USER_OBJ, 7, NONE),
            (USER, 7, 1000),
            (GROUP_OBJ, 7, NONE),
            (MASK, 5, NONE),
            (OTHER, 1, NONE),
        ]);
        assert_eq!(mode_bits(&v), Ok((0o751, true)));
        // chmod 0640: the mask takes the group bits, the owning group's entry stays.
        let after = Acl::parse(&chmod(&v, 0o640).unwrap()).unwrap();
        assert_eq!(after.bits(), 0o640);
        assert_eq!(after.perm(GROUP_OBJ), 7);
        assert_eq!(after.perm(USER), 7, "named entries are not touched");
    }

    #[test]
    fn malformed_values_are_refused() {
        assert_eq!(Acl::parse(b""), Err(libc::EINVAL));
        assert_eq!(Acl::parse(&[2, 0, 0, 0, 1]), Err(libc::EINVAL));
        let mut v = acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 0, NONE)]);
        v[0] = 1;
        assert_eq!(Acl::parse(&v), Err(libc::EINVAL));
        // Named entries need a mask.
        let v = acl(&[
            (USER_OBJ, 6, NONE),
            (USER, 6, 7),
            (GROUP_OBJ, 4, NONE),
            (OTHER, 0, NONE),
        ]);
        assert_eq!(Acl::parse(&v), Err(libc::EINVAL));
    }

    #[test]
    fn a_new_file_takes_the_default_acl_masked_by_its_mode_and_no_umask() {
        let default = acl(&[
            (USER_OBJ, 7, NONE),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, NONE),
            (MASK, 7, NONE),
            (OTHER, 5, NONE),
        ]);
        let (mode, xattrs) = inherit(Some(&default), libc::S_IFREG | 0o666, 0o077);
        assert_eq!(mode, libc::S_IFREG | 0o664);
        assert_eq!(xattrs.len(), 1);
        assert_eq!(xattrs[0].0, ACCESS_XATTR);
        let access = Acl::parse(&xattrs[0].1).unwrap();
        assert_eq!(access.perm(MASK), 6);
        assert_eq!(access.perm(USER_OBJ), 6);
        assert_eq!(access.perm(OTHER), 4);
        let (mode, xattrs) = inherit(Some(&default), libc::S_IFDIR | 0o2777, 0o077);
        assert_eq!(mode, libc::S_IFDIR | 0o2775);
        assert_eq!(xattrs[1], (DEFAULT_XATTR.to_vec(), default.clone()));
        let (mode, xattrs) = inherit(Some(&default), libc::S_IFLNK | 0o777, 0o077);
        assert_eq!((mode, xattrs.len()), (libc::S_IFLNK | 0o777, 0));
    }

    #[test]
    fn without_a_default_acl_the_umask_applies() {
        assert_eq!(
            inherit(None, libc::S_IFREG | 0o666, 0o022),
            (libc::S_IFREG | 0o644, Vec::new())
        );
        // A minimal default ACL gives a minimal access ACL: only the mode carries it.
        let default = acl(&[(USER_OBJ, 7, NONE), (GROUP_OBJ, 0, NONE), (OTHER, 0, NONE)]);
        assert_eq!(
            inherit(Some(&default), libc::S_IFREG | 0o666, 0o022),
            (libc::S_IFREG | 0o600, Vec::new())
        );
    }
}
