//! Volumes for the tests: a real SQLite file and a real data directory in a temp dir.

use std::path::PathBuf;
use std::process::Command;

use super::{Mount, TempDir, lanefs};

pub struct Volume {
    pub dir: TempDir,
    pub db: PathBuf,
    pub data: PathBuf,
}

impl Volume {
    /// `lanefs format` of a new volume.
    pub fn format(tag: &str) -> Volume {
        let dir = TempDir::new(&format!("vol-{tag}"));
        let db = dir.path().join("vol.db");
        let data = dir.path().join("data");
        let out = Command::new(lanefs())
            .arg("format")
            .arg(&db)
            .arg("--data")
            .arg(&data)
            .output()
            .expect("running lanefs format");
        assert!(
            out.status.success(),
            "lanefs format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Volume { dir, db, data }
    }

    pub fn source(&self) -> &str {
        self.db.to_str().expect("temp paths are UTF-8")
    }

    pub fn mount(&self, args: &[&str]) -> Mount {
        Mount::start(self.source(), args)
    }

    /// `lanefs fsck [--repair]`: (success, stdout and stderr).
    pub fn fsck(&self, repair: bool) -> (bool, String) {
        let mut command = Command::new(lanefs());
        command.arg("fsck").arg(&self.db);
        if repair {
            command.arg("--repair");
        }
        let out = command.output().expect("running lanefs fsck");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// Asserts that fsck finds nothing.
    pub fn assert_clean(&self) {
        let (ok, out) = self.fsck(false);
        assert!(ok && out.contains("clean"), "fsck is not clean:\n{out}");
    }
}
