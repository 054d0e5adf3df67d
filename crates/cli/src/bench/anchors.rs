//! The anchors the bench builds or finds: libfuse's example servers, compiled from the source
//! Debian's libfuse3-dev ships, qemu-storage-daemon when installed, and servers given by path
//! (`--anchor NAME=PATH`) that were built outside the repository from their public sources.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What libfuse's own build (meson) detects on glibc and puts in config.h; without them the
/// examples compile without utimens, fallocate, xattrs, ... and e.g. tar fails on
/// passthrough_fh with "Cannot utime: Function not implemented".
const HAVE: [&str; 7] = [
    "HAVE_COPY_FILE_RANGE",
    "HAVE_FALLOCATE",
    "HAVE_FDATASYNC",
    "HAVE_FSTATAT",
    "HAVE_POSIX_FALLOCATE",
    "HAVE_SETXATTR",
    "HAVE_UTIMENSAT",
];
const BUILD_TAG: &str = "b2";

/// libfuse's examples the bench uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Example {
    Null,
    PassthroughLl,
    PassthroughFh,
}

impl Example {
    pub fn name(self) -> &'static str {
        match self {
            Example::Null => "null",
            Example::PassthroughLl => "passthrough_ll",
            Example::PassthroughFh => "passthrough_fh",
        }
    }
}

/// An anchor the bench only runs, given by path: never built, fetched or committed here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum External {
    /// libfuse's example/passthrough_hp from libfuse's current source: io_uring, clone_fd
    /// and kernel passthrough, the strongest passthrough server there is.
    PassthroughHp,
    /// JuiceFS, the anchor for lanefs's volume file system.
    JuiceFs,
}

impl External {
    pub const ALL: [External; 2] = [External::PassthroughHp, External::JuiceFs];

    pub fn name(self) -> &'static str {
        match self {
            External::PassthroughHp => "passthrough_hp",
            External::JuiceFs => "juicefs",
        }
    }

    /// LANEFS_ANCHOR_PASSTHROUGH_HP, LANEFS_ANCHOR_JUICEFS: the path when no --anchor names it.
    pub fn env_var(self) -> String {
        format!("LANEFS_ANCHOR_{}", self.name().to_uppercase())
    }

    /// Where the binary comes from, for the note when it is missing.
    fn source(self) -> &'static str {
        match self {
            External::PassthroughHp => {
                "build/example/passthrough_hp of libfuse's source built with meson"
            }
            External::JuiceFs => "the juicefs binary built from JuiceFS' source",
        }
    }
}

/// The paths of the anchors given by `--anchor NAME=PATH` (repeatable), else by
/// $LANEFS_ANCHOR_<NAME>; an unknown name or a missing `=` is an error.
pub fn external_paths(args: &[String]) -> Result<HashMap<External, PathBuf>, String> {
    let mut paths = HashMap::new();
    for arg in args {
        let known = || {
            External::ALL
                .iter()
                .map(|e| e.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (name, path) = arg
            .split_once('=')
            .filter(|(_, path)| !path.is_empty())
            .ok_or_else(|| format!("--anchor {arg}: use NAME=PATH (NAME: {})", known()))?;
        let which = External::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| {
                format!(
                    "--anchor {arg}: no anchor is called {name:?} (known: {})",
                    known()
                )
            })?;
        paths.insert(which, PathBuf::from(path));
    }
    for which in External::ALL {
        if !paths.contains_key(&which)
            && let Some(path) = std::env::var_os(which.env_var()).filter(|p| !p.is_empty())
        {
            paths.insert(which, PathBuf::from(path));
        }
    }
    Ok(paths)
}

/// Where Debian's libfuse3-dev puts the examples (LANEFS_LIBFUSE_EXAMPLES overrides).
pub fn examples_dir() -> PathBuf {
    std::env::var_os("LANEFS_LIBFUSE_EXAMPLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/doc/libfuse3-dev/examples"))
}

/// The bench's cache (compiled anchors, tarballs): target/bench-cache next to a binary built
/// in a cargo tree, else $XDG_CACHE_HOME/lanefs/bench-cache (or ~/.cache/...).
pub fn cache_dir(exe: &Path) -> PathBuf {
    let target = exe
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "target"));
    if let Some(target) = target {
        return target.join("bench-cache");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("lanefs").join("bench-cache")
}

/// Builds (once per cache) and remembers the examples; failures are remembered as reasons.
pub struct Anchors {
    cache: PathBuf,
    built: HashMap<Example, Result<PathBuf, String>>,
    pub libfuse_version: Option<String>,
    /// The anchors given by path.
    pub external: HashMap<External, PathBuf>,
}

impl Anchors {
    pub fn new(cache: PathBuf, external: HashMap<External, PathBuf>) -> Anchors {
        let libfuse_version = Command::new("pkg-config")
            .args(["--modversion", "fuse3"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        Anchors {
            cache,
            built: HashMap::new(),
            libfuse_version,
            external,
        }
    }

    /// The path of an anchor given by path if it is an executable file, or why it cannot run.
    pub fn external(&self, which: External) -> Result<PathBuf, String> {
        let name = which.name();
        let path = self.external.get(&which).ok_or_else(|| {
            format!(
                "no --anchor {name}=PATH (or ${}) given: PATH is {}",
                which.env_var(),
                which.source()
            )
        })?;
        let meta = path
            .metadata()
            .map_err(|e| format!("--anchor {name}={}: {e}", path.display()))?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(format!(
                "--anchor {name}={}: not an executable file",
                path.display()
            ));
        }
        Ok(path.clone())
    }

    /// The compiled example, or why it cannot be had.
    pub fn get(&mut self, example: Example) -> Result<PathBuf, String> {
        if let Some(r) = self.built.get(&example) {
            return r.clone();
        }
        let r = self.build(example);
        self.built.insert(example, r.clone());
        r
    }

    fn build(&self, example: Example) -> Result<PathBuf, String> {
        let dir = examples_dir();
        let name = example.name();
        let mut source = dir.join(format!("{name}.c"));
        if !source.exists() {
            let gz = dir.join(format!("{name}.c.gz"));
            if !gz.exists() {
                return Err(format!(
                    "libfuse's {name} example: {} not found (apt-get install libfuse3-dev)",
                    source.display()
                ));
            }
            source = self.cache.join(format!("{name}.c"));
            std::fs::create_dir_all(&self.cache).map_err(|e| e.to_string())?;
            let out = Command::new("gzip")
                .arg("-dc")
                .arg(&gz)
                .output()
                .map_err(|e| format!("gzip: {e}"))?;
            std::fs::write(&source, out.stdout).map_err(|e| e.to_string())?;
        }
        let version = self.libfuse_version.clone().ok_or(
            "pkg-config finds no fuse3 (apt-get install libfuse3-dev pkg-config)".to_owned(),
        )?;
        // The tag changes whenever the flags below do, so a cached build is never stale.
        let binary = self.cache.join(format!("{name}-{version}-{BUILD_TAG}"));
        let fresh = match (binary.metadata(), source.metadata()) {
            (Ok(b), Ok(s)) => match (b.modified(), s.modified()) {
                (Ok(b), Ok(s)) => b >= s,
                _ => false,
            },
            _ => false,
        };
        if fresh {
            return Ok(binary);
        }
        std::fs::create_dir_all(&self.cache)
            .map_err(|e| format!("creating {}: {e}", self.cache.display()))?;
        let flags = |what: &str| -> Result<Vec<String>, String> {
            let out = Command::new("pkg-config")
                .args([what, "fuse3"])
                .output()
                .map_err(|e| format!("pkg-config: {e}"))?;
            Ok(String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect())
        };
        let tmp = binary.with_extension("tmp");
        let out = Command::new("cc")
            .args(["-O2", "-D_FILE_OFFSET_BITS=64"])
            .args(HAVE.iter().map(|h| format!("-D{h}")))
            .args(flags("--cflags")?)
            .arg("-I")
            .arg(&dir)
            .arg(&source)
            .arg("-o")
            .arg(&tmp)
            .args(flags("--libs")?)
            .output()
            .map_err(|e| format!("cc: {e} (apt-get install build-essential)"))?;
        if !out.status.success() {
            return Err(format!(
                "compiling libfuse's {name} example failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .find(|l| l.contains("error"))
                    .unwrap_or("cc failed")
            ));
        }
        std::fs::rename(&tmp, &binary).map_err(|e| e.to_string())?;
        Ok(binary)
    }
}

/// qemu-storage-daemon in PATH (Debian: qemu-system-common), with its version line.
pub fn qemu_storage_daemon() -> Result<(PathBuf, String), String> {
    let out = Command::new("qemu-storage-daemon")
        .arg("--version")
        .output()
        .map_err(|_| {
            "qemu-storage-daemon is not installed (Debian: apt-get install qemu-system-common)"
                .to_owned()
        })?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    Ok((PathBuf::from("qemu-storage-daemon"), version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_by_name_and_path() {
        let paths = external_paths(&[
            "passthrough_hp=/opt/hp".to_owned(),
            "juicefs=/opt/juicefs".to_owned(),
            "passthrough_hp=/opt/hp2".to_owned(),
        ])
        .unwrap();
        assert_eq!(paths[&External::PassthroughHp], PathBuf::from("/opt/hp2"));
        assert_eq!(paths[&External::JuiceFs], PathBuf::from("/opt/juicefs"));
        let e = external_paths(&["hp=/x".to_owned()]).unwrap_err();
        assert!(
            e.contains("no anchor is called \"hp\"") && e.contains("passthrough_hp"),
            "{e}"
        );
        assert!(
            external_paths(&["passthrough_hp".to_owned()])
                .unwrap_err()
                .contains("NAME=PATH")
        );
        assert!(
            external_paths(&["juicefs=".to_owned()])
                .unwrap_err()
                .contains("NAME=PATH")
        );
    }

    #[test]
    fn a_missing_or_unusable_anchor_says_why() {
        let mut external = HashMap::new();
        external.insert(
            External::PassthroughHp,
            PathBuf::from("/nonexistent/passthrough_hp"),
        );
        external.insert(External::JuiceFs, PathBuf::from("/proc/version"));
        let anchors = Anchors {
            cache: PathBuf::from("/nonexistent"),
            built: HashMap::new(),
            libfuse_version: None,
            external,
        };
        let e = anchors.external(External::PassthroughHp).unwrap_err();
        assert!(e.contains("/nonexistent/passthrough_hp"), "{e}");
        let e = anchors.external(External::JuiceFs).unwrap_err();
        assert!(e.contains("not an executable file"), "{e}");
        let none = Anchors {
            external: HashMap::new(),
            ..anchors
        };
        let e = none.external(External::PassthroughHp).unwrap_err();
        assert!(e.contains("LANEFS_ANCHOR_PASSTHROUGH_HP"), "{e}");
    }
}
