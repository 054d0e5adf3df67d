//! MinIO for the bench: the S3 server the volume's rows on S3 share. Started on the first row
//! that needs it, once per run: its data in a directory on the native disk, a free loopback
//! port, one bucket (each volume a prefix of its own); killed and removed when the bench's
//! context drops, on success, error or Ctrl-C (a second Ctrl-C kills it through the
//! emergency-cleanup registry).
//!
//! The binary: $LANEFS_MINIO, else `minio` on PATH, else /usr/local/bin/minio (where
//! scripts/setup.sh installs it), as the tests find it. Buckets are made with curl's SigV4
//! signing, as the tests make theirs.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::postgres::Unavailable;
use crate::bench::signals;
use crate::bench::systems::{ScratchDir, last_lines};

/// MinIO's root user: the access key lanefs signs with. Not a secret: the server listens on
/// loopback only, for one bench run, and holds nothing but benchmark files.
const ACCESS_KEY: &str = "lanefs-bench";
const SECRET_KEY: &str = "lanefs-bench-secret";
/// The one bucket; each volume is a prefix in it.
const BUCKET: &str = "lanefs-bench";
/// How long MinIO may take to answer its readiness probe (about 0.5 s on an idle machine;
/// far more on two cores busy with a build).
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long creating the bucket may be retried: MinIO answers 503 for a moment after its
/// readiness probe first says yes (it is still loading its configuration).
const BUCKET_WITHIN: Duration = Duration::from_secs(30);
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Ports tried, from `FIRST_PORT` up: below the ephemeral range (32768 and up), so that no
/// client's outgoing connection holds the port the server wants.
const FIRST_PORT: u16 = 20_000;
const PORTS: u16 = 12_000;

/// The bench's MinIO server.
pub struct S3Server {
    child: Child,
    port: u16,
    version: String,
    prefixes: u32,
    /// The server's entry in the emergency-cleanup registry.
    registration: u64,
    /// Last field: removed after `drop` killed the server.
    dir: ScratchDir,
}

impl S3Server {
    /// A started MinIO with its data in `dir` (made for it on the native disk) and an empty
    /// bucket.
    pub fn start(dir: ScratchDir) -> Result<S3Server, Unavailable> {
        let binary = find_binary().map_err(|why| {
            Unavailable::NotInstalled(format!(
                "MinIO is not installed ({why}; scripts/setup.sh installs it)"
            ))
        })?;
        if Command::new("curl").arg("--version").output().is_err() {
            return Err(Unavailable::NotInstalled(
                "curl, which makes the bench's S3 bucket, is not installed".into(),
            ));
        }
        let failed = Unavailable::Failed;
        let version = Command::new(&binary)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            // "minio version RELEASE.… (commit-id=…)": its third word.
            .and_then(|v| v.split_whitespace().nth(2).map(str::to_owned))
            .unwrap_or_else(|| "of an unknown version".into());
        let port = free_port().ok_or_else(|| failed("no free loopback port for MinIO".into()))?;
        let data = dir.0.join("data");
        std::fs::create_dir(&data).map_err(|e| failed(format!("{}: {e}", data.display())))?;
        let log_path = dir.0.join("server.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| failed(format!("{}: {e}", log_path.display())))?;
        let log_err = log.try_clone().map_err(|e| failed(e.to_string()))?;
        let child = Command::new(&binary)
            .args(["server", "--quiet", "--address"])
            .arg(format!("127.0.0.1:{port}"))
            .arg(&data)
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own group: a terminal's Ctrl-C goes to the bench, which finishes the
            // current measurement before anything is stopped.
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("starting {}: {e}", binary.display())))?;
        let registration = signals::register_process(child.id());
        let mut server = S3Server {
            child,
            port,
            version,
            prefixes: 0,
            registration,
            dir,
        };
        server.wait_ready().map_err(|e| {
            let text = std::fs::read_to_string(server.dir.0.join("server.log")).unwrap_or_default();
            failed(format!("{e}; {}", last_lines(&text, 2)))
        })?;
        server.make_bucket().map_err(failed)?;
        Ok(server)
    }

    /// A new prefix of the bucket for one volume: the `--data` of `lanefs format`.
    pub fn new_prefix(&mut self, tag: &str) -> String {
        self.prefixes += 1;
        format!("s3://{BUCKET}/{tag}{}", self.prefixes)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The credentials lanefs reads from its environment.
    pub fn credentials(&self) -> [(&'static str, &'static str); 2] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ]
    }

    /// The release `minio --version` names ("RELEASE.2025-…", "DEVELOPMENT.GOGET").
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Until MinIO's readiness probe answers 200, or it exits.
    fn wait_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        while started.elapsed() < READY_WITHIN {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("MinIO exited ({status}) before it was ready"));
            }
            if http_status(self.port, "/minio/health/ready") == Some(200) {
                return Ok(());
            }
            std::thread::sleep(POLL_EVERY);
        }
        Err(format!(
            "MinIO was not ready on port {} within {READY_WITHIN:?}",
            self.port
        ))
    }

    /// Creates the bucket with a SigV4-signed PUT (signed by curl), retried while MinIO
    /// still answers 503.
    fn make_bucket(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let out = Command::new("curl")
                .args([
                    "-sS",
                    "-f",
                    "-X",
                    "PUT",
                    "--aws-sigv4",
                    "aws:amz:us-east-1:s3",
                ])
                .arg("--user")
                .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
                .arg(format!("{}/{BUCKET}", self.endpoint()))
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running curl: {e}"))?;
            if out.status.success() {
                return Ok(());
            }
            if started.elapsed() >= BUCKET_WITHIN {
                return Err(format!(
                    "creating the S3 bucket {BUCKET}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            std::thread::sleep(POLL_EVERY);
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // Killed: nothing in it is kept. Then `dir` is removed (a field: after this).
        let _ = self.child.kill();
        let _ = self.child.wait();
        signals::unregister(self.registration);
    }
}

/// $LANEFS_MINIO, else `minio` on PATH, else /usr/local/bin/minio; or why there is none.
fn find_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LANEFS_MINIO") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("$LANEFS_MINIO={} is not a file", p.display()))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("minio"))
            .find(|p| p.is_file())
    });
    on_path
        .or_else(|| {
            let p = Path::new("/usr/local/bin/minio");
            p.is_file().then(|| p.to_path_buf())
        })
        .ok_or_else(|| "no minio on PATH or in /usr/local/bin, no $LANEFS_MINIO".into())
}

/// A loopback port below the ephemeral range nobody listens on now, starting at a place
/// that depends on our pid (two benches at once try different ports first).
fn free_port() -> Option<u16> {
    let start = (std::process::id() % 600) as u16 * 20;
    (0..PORTS)
        .map(|i| FIRST_PORT + (start + i) % PORTS)
        .find(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
}

/// The status code of an unsigned GET of `path`; None when nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}
