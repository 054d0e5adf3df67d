//! What the edge-case suites run on: each test that compares lanefs with native tmpfs runs
//! once on a passthrough of a fresh tmpfs and once on a fresh volume (issue 17: "and for the
//! volume").

use std::path::{Path, PathBuf};

use super::volume::Volume;
use super::{Mount, Tmpfs};

/// A kind of lanefs file system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Passthrough,
    Volume,
}

/// Both kinds, for tests that loop over them.
pub const KINDS: [Kind; 2] = [Kind::Passthrough, Kind::Volume];

/// A fresh source of one kind: a tmpfs (passthrough) or a formatted volume.
pub enum Source {
    Passthrough(Tmpfs),
    /// Boxed: a volume (with its servers) is several times a tmpfs's size.
    Volume(Box<Volume>),
}

impl Source {
    pub fn new(kind: Kind, tag: &str) -> Source {
        match kind {
            Kind::Passthrough => Source::Passthrough(Tmpfs::new("64M")),
            Kind::Volume => Source::Volume(Box::new(Volume::format(tag))),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Source::Passthrough(_) => Kind::Passthrough,
            Source::Volume(_) => Kind::Volume,
        }
    }

    /// SOURCE as `lanefs mount` and mount(8) take it.
    pub fn path(&self) -> &Path {
        match self {
            Source::Passthrough(t) => &t.path,
            Source::Volume(v) => &v.db,
        }
    }

    pub fn mount(&self, args: &[&str]) -> Mount {
        Mount::start(self.path().to_str().expect("UTF-8 source path"), args)
    }

    /// Where the files of `mount` (a mount of this source) live outside the mount: the host
    /// directory of a passthrough; the mount itself for a volume, which has no host file.
    pub fn host(&self, mount: &Path) -> PathBuf {
        match self {
            Source::Passthrough(t) => t.path.clone(),
            Source::Volume(_) => mount.to_owned(),
        }
    }
}
