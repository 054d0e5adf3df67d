//! PostgreSQL for the bench: the programs of the installed version, run as the postgres
//! user, and the server the volume's rows on PostgreSQL share: initdb into a directory on
//! the native disk (fsync on as shipped: a synchronous commit waits for the disk, which is
//! what `--async-commit` saves), a free loopback port, trust authentication; started on the first row
//! that needs it, stopped (immediately: nothing in it is kept) and removed when the bench's
//! context drops, on success, error or Ctrl-C (a second Ctrl-C kills the postmaster).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::bench::apps::run;
use crate::bench::signals;
use crate::bench::systems::ScratchDir;

/// The operating-system user PostgreSQL runs as (Debian's package makes it; PostgreSQL
/// refuses to run as root).
pub const POSTGRES_USER: &str = "postgres";

/// A program of PostgreSQL's installed version: Debian's newest versioned directory.
pub fn postgres_bin(name: &str) -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!("{name} not found in /usr/lib/postgresql/*/bin (apt-get install postgresql)")
        })
}

/// A user's uid and gid, from the password database.
pub fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == name)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .ok_or_else(|| format!("no user {name} (apt-get install postgresql makes it)"))
}

/// `program` run as the postgres user (setpriv(1)).
pub fn as_postgres(program: PathBuf) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={POSTGRES_USER}"),
        &format!("--regid={POSTGRES_USER}"),
        "--init-groups",
        "--",
    ])
    .arg(program);
    c
}

/// Why the rows on PostgreSQL cannot run.
#[derive(Clone, Debug)]
pub enum Unavailable {
    /// Not installed: the rows are skipped with this note.
    NotInstalled(String),
    /// Installed but it did not start: the rows fail with this error.
    Failed(String),
}

/// The bench's PostgreSQL server.
pub struct PgServer {
    pg_ctl: PathBuf,
    data: PathBuf,
    port: u16,
    databases: u32,
    /// The postmaster's entry in the emergency-cleanup registry.
    registration: Option<u64>,
    /// Last field: removed after `drop` stopped the server.
    dir: ScratchDir,
}

impl PgServer {
    /// initdb into `dir` (made for it on the native disk) and a started server.
    pub fn start(dir: ScratchDir) -> Result<PgServer, Unavailable> {
        let installed = || -> Result<(PathBuf, PathBuf, (u32, u32)), String> {
            Ok((
                postgres_bin("initdb")?,
                postgres_bin("pg_ctl")?,
                user_ids(POSTGRES_USER)?,
            ))
        };
        let (initdb, pg_ctl, (uid, gid)) = installed().map_err(|e| {
            Unavailable::NotInstalled(format!(
                "PostgreSQL is not installed ({e}; scripts/setup.sh installs it)"
            ))
        })?;
        let failed = Unavailable::Failed;
        std::os::unix::fs::chown(&dir.0, Some(uid), Some(gid))
            .map_err(|e| failed(format!("chown {}: {e}", dir.0.display())))?;
        let data = dir.0.join("data");
        let mut init = as_postgres(initdb);
        init.arg("-D")
            .arg(&data)
            .args(["-U", POSTGRES_USER, "--auth=trust", "--no-sync"]);
        run(init, "initdb").map_err(failed)?;
        let port = free_port().map_err(failed)?;
        let mut server = PgServer {
            pg_ctl,
            data,
            port,
            databases: 0,
            registration: None,
            dir,
        };
        let log = server.dir.0.join("server.log");
        let mut start = as_postgres(server.pg_ctl.clone());
        start
            .arg("-D")
            .arg(&server.data)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
                server.dir.0.display()
            ))
            .args(["-w", "start"]);
        let started = run(start, "pg_ctl start");
        // Registered even if pg_ctl gave up waiting: a postmaster may be running.
        server.registration = server.postmaster_pid().map(signals::register_process);
        started.map_err(|e| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            failed(format!(
                "{e}; {}",
                crate::bench::systems::last_lines(&text, 2)
            ))
        })?;
        Ok(server)
    }

    /// A new, empty database; its URL (no password: trust authentication on loopback).
    pub fn createdb(&mut self, tag: &str) -> Result<String, String> {
        self.databases += 1;
        let name = format!("{tag}{}", self.databases);
        let createdb = postgres_bin("createdb")?;
        let mut c = as_postgres(createdb);
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", POSTGRES_USER, &name]);
        run(c, "createdb")?;
        Ok(format!(
            "postgres://{POSTGRES_USER}@127.0.0.1:{}/{name}",
            self.port
        ))
    }

    pub fn version(&self) -> String {
        std::fs::read_to_string(self.data.join("PG_VERSION"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    }

    /// The postmaster's pid: postmaster.pid's first line.
    fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Immediate: nothing in it is kept. Then `dir` is removed (a field: after this).
        let _ = as_postgres(self.pg_ctl.clone())
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-m", "immediate", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(id) = self.registration {
            signals::unregister(id);
        }
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free loopback port: {e}"))
}
