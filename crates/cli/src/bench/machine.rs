//! What the bench ran on: kernel, CPU, cores, memory, load, the lanefs revision and the date.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Serialize, Clone, Debug)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    /// Online CPUs (what job and queue counts are derived from).
    pub cores: usize,
    pub memory_bytes: u64,
    /// /proc/loadavg when the run started: anything else running skews the numbers.
    pub loadavg_at_start: String,
    pub open_file_limit: u64,
}

impl Machine {
    pub fn probe() -> Machine {
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find(|l| {
                l.starts_with("model name") || l.starts_with("Model") || l.starts_with("cpu model")
            })
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let memory_bytes = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        Machine {
            hostname: hostname(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            cores: cores(),
            memory_bytes,
            loadavg_at_start: read("/proc/loadavg").trim().to_owned(),
            open_file_limit: limit.rlim_cur,
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub fn hostname() -> String {
    let h = read("/proc/sys/kernel/hostname").trim().to_owned();
    if h.is_empty() { "localhost".into() } else { h }
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The lanefs source revision: `git rev-parse HEAD` in the tree it was built from (or the
/// current directory), "unknown" without git.
#[derive(Serialize, Clone, Debug)]
pub struct Revision {
    pub revision: String,
    /// Uncommitted changes in the tree (`git status --porcelain` not empty).
    pub dirty: Option<bool>,
    pub version: String,
}

impl Revision {
    pub fn probe() -> Revision {
        let dirs = [Path::new(env!("CARGO_MANIFEST_DIR")), Path::new(".")];
        for dir in dirs {
            let Some(rev) = git(dir, &["rev-parse", "HEAD"]) else {
                continue;
            };
            let dirty =
                git(dir, &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
            return Revision {
                revision: rev,
                dirty,
                version: env!("CARGO_PKG_VERSION").into(),
            };
        }
        Revision {
            revision: "unknown".into(),
            dirty: None,
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A UTC timestamp, formatted without a date crate.
#[derive(Clone, Copy, Debug)]
pub struct Utc {
    pub unix: u64,
}

pub fn now_utc() -> Utc {
    Utc {
        unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

impl Utc {
    /// (year, month, day, hour, minute, second).
    pub fn parts(self) -> (i64, u32, u32, u32, u32, u32) {
        let days = (self.unix / 86_400) as i64;
        let secs = self.unix % 86_400;
        let (y, m, d) = civil_from_days(days);
        (
            y,
            m,
            d,
            (secs / 3600) as u32,
            (secs / 60 % 60) as u32,
            (secs % 60) as u32,
        )
    }

    /// 2026-11-22
    pub fn date_compact(self) -> String {
        let (y, m, d, ..) = self.parts();
        format!("{y:04}-{m:02}-{d:02}")
    }

    /// 2026-11-22T16:35:55Z
    pub fn iso(self) -> String {
        let (y, m, d, h, mi, s) = self.parts();
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    }
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(Utc { unix: 0 }.iso(), "1970-01-01T00:00:00Z");
        assert_eq!(Utc { unix: 951_782_400 }.date_compact(), "2000-02-29");
        assert_eq!(
            Utc {
                unix: 1_795_365_373
            }
            .iso(),
            "2026-11-22T16:36:13Z"
        );
    }
}
