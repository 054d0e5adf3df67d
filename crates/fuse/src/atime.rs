//! When reading a file or listing a directory moves its access time: a mount's atime flags
//! and the kernel's rule for them (fs/inode.c, `atime_needs_update` and
//! `relatime_need_update`). FUSE inodes are S_NOATIME, so the kernel leaves atime to the
//! server, and every file system that keeps its own times applies this rule itself.

/// Nanoseconds in a day: relatime moves an atime at least this old.
const RELATIME_MAX_AGE_NS: i64 = 24 * 60 * 60 * 1_000_000_000;

/// A mount's atime flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Atime {
    pub rule: AtimeRule,
    /// Directories' atime moves too (not `nodiratime`).
    pub directories: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtimeRule {
    /// `relatime` (the default): when atime is not after mtime or ctime, or a day old.
    Relative,
    /// `strictatime`: on every access.
    Always,
    /// `noatime` (and a read-only mount).
    Never,
}

impl Default for Atime {
    fn default() -> Self {
        Atime {
            rule: AtimeRule::Relative,
            directories: true,
        }
    }
}

impl Atime {
    /// Whether an access at `now` moves the atime of an inode with these times (all in
    /// nanoseconds since the epoch), as the kernel decides for a mount with these flags.
    pub fn moves(self, is_dir: bool, atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
        if is_dir && !self.directories {
            return false;
        }
        match self.rule {
            AtimeRule::Never => false,
            AtimeRule::Always => atime != now,
            AtimeRule::Relative => {
                mtime >= atime || ctime >= atime || now - atime >= RELATIME_MAX_AGE_NS
            }
        }
    }

    /// The flags as one byte, for an atomic that a remount changes.
    pub fn to_bits(self) -> u8 {
        let rule = match self.rule {
            AtimeRule::Relative => 0,
            AtimeRule::Always => 1,
            AtimeRule::Never => 2,
        };
        rule | (u8::from(!self.directories) << 2)
    }

    /// The inverse of [`Atime::to_bits`].
    pub fn from_bits(bits: u8) -> Atime {
        let rule = match bits & 3 {
            1 => AtimeRule::Always,
            2 => AtimeRule::Never,
            _ => AtimeRule::Relative,
        };
        Atime {
            rule,
            directories: bits & 4 == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = RELATIME_MAX_AGE_NS;

    #[test]
    fn relatime_moves_atime_only_when_it_is_not_after_mtime_or_ctime_or_a_day_old() {
        let relative = Atime::default();
        let now = 10 * DAY;
        // (atime, mtime, ctime) → moves
        for (a, m, c, moves) in [
            (now - 10, now - 20, now - 20, false),
            (now - 20, now - 20, now - 30, true),
            (now - 20, now - 30, now - 10, true),
            (now - DAY, now - 2 * DAY, now - 2 * DAY, true),
            (now - DAY + 1, now - 2 * DAY, now - 2 * DAY, false),
        ] {
            assert_eq!(relative.moves(false, a, m, c, now), moves, "{a} {m} {c}");
        }
        let strict = Atime {
            rule: AtimeRule::Always,
            directories: false,
        };
        assert!(strict.moves(false, now - 10, 0, 0, now));
        assert!(!strict.moves(true, now - 10, 0, 0, now), "nodiratime");
        let never = Atime {
            rule: AtimeRule::Never,
            directories: true,
        };
        assert!(!never.moves(false, 0, now, now, now));
        for atime in [relative, strict, never] {
            assert_eq!(Atime::from_bits(atime.to_bits()), atime);
        }
    }
}
