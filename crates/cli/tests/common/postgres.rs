//! A real PostgreSQL server for one test: initdb into a temp dir (as user postgres: initdb
//! refuses root), started on a free loopback port with trust authentication and fsync on,
//! stopped (immediately) and removed when dropped, pass or fail. Where PostgreSQL is not
//! installed (scripts/setup.sh installs it), `start` says "skipped: why" and gives None.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::TempDir;
use super::launcher::Launcher;

/// The user the server runs as (Debian's package makes it).
const PG_USER: &str = "postgres";

pub struct PgServer {
    bin: PathBuf,
    pub port: u16,
    data: PathBuf,
    sockets: PathBuf,
    /// Runs initdb and pg_ctl (see `Launcher` for why the test does not itself).
    launcher: Mutex<Launcher>,
    /// Last field: removed after `drop` stopped the server.
    dir: TempDir,
}

/// The directory of initdb and pg_ctl: the newest /usr/lib/postgresql/N/bin.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free loopback port")
}

impl PgServer {
    /// A fresh server, or None (after saying why) where PostgreSQL is not installed.
    pub fn start(tag: &str) -> Option<PgServer> {
        let Some(bin) = bin_dir() else {
            eprintln!(
                "skipped: PostgreSQL is not installed (no /usr/lib/postgresql/N/bin/initdb; scripts/setup.sh installs it)"
            );
            return None;
        };
        let dir = TempDir::new(&format!("pg-{tag}"));
        let data = dir.path().join("data");
        let sockets = dir.path().join("sockets");
        std::fs::create_dir_all(&sockets).expect("creating the socket dir");
        let chown = Command::new("chown")
            .args(["-R", PG_USER])
            .arg(dir.path())
            .status()
            .expect("running chown");
        assert!(chown.success(), "chown of {} failed", dir.path().display());
        let launcher = match Launcher::start(&[]) {
            Ok(launcher) => Mutex::new(launcher),
            Err(why) => panic!("{why}"),
        };
        let server = PgServer {
            bin,
            port: free_port(),
            data,
            sockets,
            launcher,
            dir,
        };
        server.as_postgres(
            "initdb",
            &[
                "-D",
                server.data.to_str().expect("UTF-8 temp path"),
                "-A",
                "trust",
                "-U",
                PG_USER,
                "--no-sync",
            ],
        );
        server.pg_ctl_start();
        Some(server)
    }

    /// Runs one of the server's programs as the postgres user (from the launcher); panics
    /// with its output if it fails.
    fn as_postgres(&self, program: &str, args: &[&str]) {
        let program_path = self.bin.join(program);
        let mut argv = vec![
            "runuser",
            "-u",
            PG_USER,
            "--",
            program_path.to_str().expect("a UTF-8 PostgreSQL path"),
        ];
        argv.extend_from_slice(args);
        let output = self.dir.path().join(format!("{program}.out"));
        let ok = self.launcher.lock().unwrap_or_else(|e| e.into_inner()).run(
            self.dir.path(),
            &argv,
            &output,
        );
        assert!(
            ok,
            "{program} {args:?}: {}",
            std::fs::read_to_string(&output).unwrap_or_default()
        );
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.sockets.display()
        );
        let log = self.dir.path().join("server.log");
        self.as_postgres(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().expect("UTF-8 temp path"),
                "-l",
                log.to_str().expect("UTF-8 temp path"),
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
    }

    fn pg_ctl_stop(&self, mode: &str) {
        self.as_postgres(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().expect("UTF-8 temp path"),
                "-w",
                "-m",
                mode,
                "stop",
            ],
        );
    }

    /// A new, empty database; its URL (no password: trust authentication).
    pub fn createdb(&self, name: &str) -> String {
        self.as_postgres(
            "createdb",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
                name,
            ],
        );
        format!("postgres://{PG_USER}@127.0.0.1:{}/{name}", self.port)
    }

    /// Stops the server the hard way (as a crash would: `immediate`, no checkpoint) and
    /// starts it again, after `down` with it stopped.
    pub fn restart(&self, down: std::time::Duration) {
        self.stop();
        std::thread::sleep(down);
        self.start_again();
    }

    /// Stops the server as a crash would (`-m immediate`), until `start_again`.
    pub fn stop(&self) {
        self.pg_ctl_stop("immediate");
    }

    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// Runs SQL in a database (through psql over the socket directory).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .psql_command(db)
            .args(["-c", sql])
            .output()
            .expect("running psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// psql as the server's user, on database `db`, unaligned tuples only.
    fn psql_command(&self, db: &str) -> Command {
        let mut command = Command::new("runuser");
        command
            .args(["-u", PG_USER, "--"])
            .arg(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
            ])
            .args(["-d", db, "-At"])
            .current_dir(self.dir.path());
        command
    }

    /// Runs `sql` in a transaction of a psql session of its own that stays open (its locks
    /// held) until the returned guard is dropped, which rolls it back.
    pub fn hold(&self, db: &str, sql: &str) -> HeldTransaction {
        use std::io::{BufRead, Write};
        let mut child = self
            .psql_command(db)
            .args(["-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running psql");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "BEGIN; {sql}; SELECT 'held';").unwrap();
        // Command tags come first (BEGIN, LOCK TABLE…), then the marker.
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "psql ended: {sql}");
            if line.trim() == "held" {
                break;
            }
        }
        HeldTransaction {
            child,
            stdin: Some(stdin),
            _stdout: out,
        }
    }
}

/// A transaction held open by [`PgServer::hold`].
pub struct HeldTransaction {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    /// Kept open until psql ends, so that its answer to ROLLBACK has somewhere to go.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Drop for HeldTransaction {
    fn drop(&mut self) {
        use std::io::Write;
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "ROLLBACK;");
        }
        let _ = self.child.wait();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Immediate: nothing to keep. Errors are ignored (a test may have stopped it).
        let data = self.data.to_str().expect("UTF-8 temp path").to_owned();
        let pg_ctl = self.bin.join("pg_ctl");
        let launcher = self.launcher.get_mut().unwrap_or_else(|e| e.into_inner());
        launcher.run(
            self.dir.path(),
            &[
                "runuser",
                "-u",
                PG_USER,
                "--",
                pg_ctl.to_str().expect("a UTF-8 PostgreSQL path"),
                "-D",
                &data,
                "-w",
                "-m",
                "immediate",
                "stop",
            ],
            Path::new("/dev/null"),
        );
    }
}
