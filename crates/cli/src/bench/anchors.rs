//! The anchors the bench builds or finds: libfuse's example servers, compiled from the source
//! Debian's libfuse3-dev ships, and qemu-storage-daemon when installed.

use std::collections::HashMap;
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
}

impl Anchors {
    pub fn new(cache: PathBuf) -> Anchors {
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
        }
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
