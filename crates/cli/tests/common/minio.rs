//! A real S3 server for the tests: MinIO on a free loopback port, its data in a temp dir,
//! killed and removed when dropped (pass or fail); `stop` and `start` for fault tests. And
//! volumes whose blocks live in one of its buckets.
//!
//! The binary: $LANEFS_MINIO, else `minio` on PATH, else /usr/local/bin/minio (where
//! scripts/setup.sh installs it with `go install`). Without one, `Minio::start` says why and
//! the test prints "skipped: why".

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use super::launcher::Launcher;
use super::{Mount, TempDir, lanefs, wait_until};

/// MinIO's root user: the tests' S3 access key (not a secret: loopback only, test data).
pub const ACCESS_KEY: &str = "lanefs-test";
pub const SECRET_KEY: &str = "lanefs-test-secret";
/// How long MinIO may take to answer its readiness probe after starting: a fresh one is
/// ready in ~0.5 s, one started again on its port and data by a fault test in about as long.
const READY_WITHIN: Duration = Duration::from_secs(60);

pub struct Minio {
    pub port: u16,
    binary: PathBuf,
    /// Starts and kills the server (see `Launcher` for why the test does not itself); when
    /// dropped, kills it.
    launcher: Launcher,
    /// The running server's pid, if it runs.
    server: Option<u32>,
    /// Last field: removed after the launcher killed the server.
    dir: TempDir,
}

fn find_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("LANEFS_MINIO") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var("PATH").ok().and_then(|path| {
        path.split(':')
            .map(|d| Path::new(d).join("minio"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/local/bin/minio");
        p.is_file().then_some(p)
    })
}

/// A free loopback port below the ephemeral range (32768 and up): a client retrying
/// connections to a stopped server on an ephemeral port can end up connected to itself
/// (TCP simultaneous open) and hold the port the server must bind again. Never the same port
/// twice in one test process: a stopped MinIO's port is free, and another test's MinIO
/// started there would answer the first one's clients (with 404s) and keep it from coming
/// back.
fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    const PORTS: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % 600) as u16 * 20;
    (0..PORTS)
        .map(|_| FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed) % PORTS) % PORTS)
        .find(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free loopback port")
}

impl Minio {
    /// A running MinIO with an empty data directory, or why there can be none.
    pub fn start(tag: &str) -> Result<Minio, String> {
        let binary = find_binary().ok_or(
            "no minio binary (set LANEFS_MINIO, or run scripts/setup.sh, which builds it with go install)",
        )?;
        if Command::new("curl").arg("--version").output().is_err() {
            return Err("no curl to create buckets with".into());
        }
        let dir = TempDir::new(&format!("minio-{tag}"));
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let launcher = Launcher::start(&[
            ("MINIO_ROOT_USER", ACCESS_KEY),
            ("MINIO_ROOT_PASSWORD", SECRET_KEY),
            ("MINIO_BROWSER", "off"),
            // Its request counters readable without a token (`requests`).
            ("MINIO_PROMETHEUS_AUTH_TYPE", "public"),
        ])?;
        let mut minio = Minio {
            port: free_port(),
            binary,
            launcher,
            server: None,
            dir,
        };
        minio.start_again();
        Ok(minio)
    }

    /// Starts the (stopped) server again, on the same port and data; waits until it is ready.
    pub fn start_again(&mut self) {
        assert!(self.server.is_none(), "MinIO is already running");
        let address = format!("127.0.0.1:{}", self.port);
        let data = self.dir.path().join("data");
        let pid = self.launcher.spawn(
            &[
                self.binary.to_str().expect("a UTF-8 path to minio"),
                "server",
                "--address",
                &address,
                data.to_str().expect("temp paths are UTF-8"),
            ],
            &self.dir.path().join("log"),
        );
        self.server = Some(pid);
        let started = std::time::Instant::now();
        // What the probe got, counted by answer: in the failure message.
        let mut answers = std::collections::BTreeMap::<String, u32>::new();
        let ready = wait_until(READY_WITHIN, || {
            let answer = self.readiness();
            let ready = answer.split(' ').nth(1) == Some("200");
            *answers.entry(answer).or_default() += 1;
            ready
        });
        eprintln!(
            "MinIO on port {}: ready after {:?}",
            self.port,
            started.elapsed()
        );
        assert!(
            ready,
            "MinIO did not become ready on port {} (running: {}; probe answers: {answers:?}):\n{}",
            self.port,
            Path::new(&format!("/proc/{pid}")).exists(),
            std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
        );
    }

    /// Kills the server (SIGKILL: as a crash or a pulled cable would) and waits for it.
    pub fn stop(&mut self) {
        if let Some(pid) = self.server.take() {
            self.launcher.kill(pid);
        }
    }

    /// How many S3 requests of one kind (`GetObject`, `PutObject`, …) MinIO has served since
    /// it started, from its metrics (version 3: counted as they happen, not cached).
    pub fn requests(&self, api: &str) -> u64 {
        let answer = self.http_get("/minio/metrics/v3/api/requests");
        let series = format!("minio_api_requests_total{{name=\"{api}\",");
        answer
            .lines()
            .filter(|l| l.starts_with(&series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// The answer (head and body) to an unsigned GET of `path`; empty when there is none.
    fn http_get(&self, path: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let mut answer = String::new();
        if s.write_all(request.as_bytes()).is_err() || s.read_to_string(&mut answer).is_err() {
            return String::new();
        }
        answer
    }

    /// The status line of MinIO's readiness probe ("(no answer)": nothing listening, or
    /// no answer within the read timeout). Asked from this process: a curl process per probe,
    /// every 20 ms for minutes, brought the pid counter round (pid_max 32768 here) and fared
    /// no better.
    fn readiness(&self) -> String {
        let answer = self.http_get("/minio/health/ready");
        answer.lines().next().unwrap_or("(no answer)").to_owned()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A SigV4-signed S3 request (signed by curl) to `path` (`BUCKET[/KEY]`), with a body
    /// (sent unsigned) when one is given. MinIO answers 503 for a moment after its
    /// readiness probe first says yes (it is still loading its configuration): retried.
    pub fn request(&self, method: &str, path: &str, body: Option<&Path>) {
        let mut last = String::new();
        let done = wait_until(READY_WITHIN, || {
            let mut curl = Command::new("curl");
            curl.args([
                "-sS",
                "-f",
                "-X",
                method,
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
            ])
            .arg("--user")
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"));
            if let Some(body) = body {
                curl.arg("--data-binary")
                    .arg(format!("@{}", body.display()))
                    .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
            }
            let out = curl
                .arg(format!("{}/{path}", self.endpoint()))
                .output()
                .unwrap();
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            out.status.success()
        });
        assert!(done, "S3 {method} {path}: {last}");
    }

    /// Creates a bucket through the S3 API.
    pub fn make_bucket(&self, bucket: &str) {
        self.request("PUT", bucket, None);
    }

    /// The objects under `bucket/prefix`, as MinIO keeps them on its disk (one directory
    /// holding `xl.meta` per object).
    pub fn objects(&self, bucket: &str, prefix: &str) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.join("xl.meta").is_file() {
                    out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
                } else if p.is_dir() {
                    walk(&p, root, out);
                }
            }
        }
        let root = self.dir.path().join("data").join(bucket).join(prefix);
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out.sort();
        out
    }

    /// The block objects under `bucket/prefix`.
    pub fn blocks(&self, bucket: &str, prefix: &str) -> usize {
        self.objects(bucket, prefix)
            .iter()
            .filter(|k| k.starts_with("blocks/"))
            .count()
    }
}

/// The credentials a lanefs command needs for the tests' MinIO, as `env` arguments.
fn credentials_env() -> [String; 2] {
    [
        format!("AWS_ACCESS_KEY_ID={ACCESS_KEY}"),
        format!("AWS_SECRET_ACCESS_KEY={SECRET_KEY}"),
    ]
}

/// A volume with its metadata in an SQLite file and its blocks in a MinIO bucket.
pub struct S3Volume {
    pub dir: TempDir,
    pub db: PathBuf,
    pub bucket: String,
    pub prefix: String,
    pub endpoint: String,
}

impl S3Volume {
    /// `lanefs format VOL --data s3://BUCKET/PREFIX --s3-endpoint` on a new bucket.
    pub fn format(minio: &Minio, tag: &str) -> S3Volume {
        let bucket = format!("lanefs-{}", tag.replace('_', "-"));
        minio.make_bucket(&bucket);
        let dir = TempDir::new(&format!("s3vol-{tag}"));
        let volume = S3Volume {
            db: dir.path().join("vol.db"),
            dir,
            bucket,
            prefix: "vol".into(),
            endpoint: minio.endpoint(),
        };
        let out = volume.lanefs(&[
            "format",
            volume.source(),
            "--data",
            &format!("s3://{}/{}", volume.bucket, volume.prefix),
            "--s3-endpoint",
            &volume.endpoint,
        ]);
        assert!(
            out.status.success(),
            "lanefs format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        volume
    }

    pub fn source(&self) -> &str {
        self.db.to_str().expect("temp paths are UTF-8")
    }

    /// A lanefs command with the MinIO credentials in its environment.
    pub fn lanefs(&self, args: &[&str]) -> Output {
        Command::new(lanefs())
            .args(args)
            .envs(
                credentials_env()
                    .iter()
                    .map(|kv| kv.split_once('=').unwrap()),
            )
            .output()
            .expect("running lanefs")
    }

    pub fn mount(&self, args: &[&str]) -> Mount {
        let env = credentials_env();
        let wrapper = ["env", env[0].as_str(), env[1].as_str()];
        Mount::start_wrapped(&wrapper, self.source(), args)
    }

    /// `lanefs fsck`: (success, stdout and stderr).
    pub fn fsck(&self) -> (bool, String) {
        let out = self.lanefs(&["fsck", self.source()]);
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    pub fn assert_clean(&self) {
        let (ok, out) = self.fsck();
        assert!(ok && out.contains("clean"), "fsck is not clean:\n{out}");
    }
}
