//! Volumes for the tests: a real SQLite file, or a database on a real PostgreSQL server of
//! the test's own, and a real data directory in a temp dir.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::postgres::PgServer;
use super::{Mount, TempDir, lanefs};

pub struct Volume {
    pub dir: TempDir,
    /// The SQLite file, or the PostgreSQL URL.
    pub db: PathBuf,
    pub data: PathBuf,
    /// The server of a volume on PostgreSQL (stopped when the volume is dropped).
    pub pg: Option<PgServer>,
}

impl Volume {
    /// `lanefs format` of a new volume.
    pub fn format(tag: &str) -> Volume {
        let dir = TempDir::new(&format!("vol-{tag}"));
        let db = dir.path().join("vol.db");
        let data = dir.path().join("data");
        format_volume(&db, &data);
        Volume {
            dir,
            db,
            data,
            pg: None,
        }
    }

    /// `lanefs format` of a new volume in a database of a PostgreSQL server of its own; None
    /// (the server said why) where PostgreSQL is not installed.
    pub fn format_on_postgres(tag: &str) -> Option<Volume> {
        let server = PgServer::start(tag)?;
        let url = server.createdb("vol");
        let dir = TempDir::new(&format!("pgvol-{tag}"));
        let data = dir.path().join("data");
        let db = PathBuf::from(url);
        format_volume(&db, &data);
        Some(Volume {
            dir,
            db,
            data,
            pg: Some(server),
        })
    }

    /// The PostgreSQL server of a volume on PostgreSQL.
    pub fn server(&self) -> &PgServer {
        self.pg.as_ref().expect("a volume on PostgreSQL")
    }
}

/// `lanefs format DB --data DATA`, which must succeed.
pub fn format_volume(db: &Path, data: &Path) {
    let out = Command::new(lanefs())
        .arg("format")
        .arg(db)
        .arg("--data")
        .arg(data)
        .output()
        .expect("running lanefs format");
    assert!(
        out.status.success(),
        "lanefs format: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Volume {
    pub fn source(&self) -> &str {
        self.db.to_str().expect("temp paths are UTF-8")
    }

    /// Mounts the volume; one on PostgreSQL keeps its intent logs in the test's temp dir
    /// (its mounts play the mounts of one machine), not in /var/lib/lanefs.
    pub fn mount(&self, args: &[&str]) -> Mount {
        if self.pg.is_none() {
            return Mount::start(self.source(), args);
        }
        let intent_dir = self.intent_dir();
        let mut with_dir = vec![
            "--intent-dir",
            intent_dir.to_str().expect("temp paths are UTF-8"),
        ];
        with_dir.extend_from_slice(args);
        Mount::start(self.source(), &with_dir)
    }

    /// Where the volume's mounts keep their intent logs.
    pub fn intent_dir(&self) -> PathBuf {
        match self.pg {
            Some(_) => self.dir.path().join("intent"),
            None => {
                let mut name = self.db.clone().into_os_string();
                name.push("-intent");
                PathBuf::from(name)
            }
        }
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

    /// Asserts that fsck finds nothing but blocks no file refers to, which a flush whose
    /// commit failed leaves to gc when it cannot read whether its rows committed (the
    /// database was still away), and that it finds nothing once gc ran.
    pub fn assert_clean_after_gc(&self) {
        let (ok, out) = self.fsck(false);
        if !ok {
            let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("block ")).collect();
            assert!(
                !problems.is_empty()
                    && problems.iter().all(|l| l.ends_with("no file refers to it")),
                "fsck found more than blocks left by failed flushes:\n{out}"
            );
            let gc = Command::new(lanefs())
                .arg("gc")
                .arg(&self.db)
                .output()
                .expect("running lanefs gc");
            assert!(
                gc.status.success(),
                "{}",
                String::from_utf8_lossy(&gc.stderr)
            );
        }
        self.assert_clean();
    }
}
