//! The applications users judge a file system by (issue 16): a PostgreSQL load and pgbench
//! run, an SQLite import, git, `cp -a` of a source tree, and a C build, each on the target.
//! Their inputs (a source tree, a git history made from it, a CSV file, a C project) are made
//! once into the bench's cache, on the native file system; what a run writes lives under
//! `app` in the target's directory and is removed after each run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::bench::model::Work;
use crate::bench::postgres::{POSTGRES_USER, as_postgres, postgres_bin, user_ids};
use crate::bench::systems::{Target, last_lines};
use crate::bench::workloads::{Meter, run_limited};

/// The directory, inside the target's, where an application works.
pub const APP_DIR: &str = "app";

/// One application workload.
#[derive(Clone, Debug)]
pub enum App {
    /// PostgreSQL with its data directory on the target (fsync on, as shipped):
    /// `pgbench -i -s scale` timed, then `pgbench -c clients -j threads -T seconds`'s TPS.
    Pgbench {
        scale: u32,
        clients: u32,
        threads: u32,
        seconds: u32,
    },
    /// `sqlite3` importing a CSV file of `rows` rows into a WAL-mode database on the target.
    SqliteImport { csv: PathBuf, rows: u64 },
    /// `git clone --no-local` of `repo`, `git status` cold (after dropping the kernel's
    /// caches) and warm, and `git checkout` of `old` and back.
    Git {
        repo: PathBuf,
        old: String,
        files: u64,
    },
    /// `cp -a` of `tree` (on the native disk) onto the target, and back to native tmpfs.
    CopyTree { tree: PathBuf, files: u64 },
    /// `make -j jobs` of a C project copied onto the target (configured first, untimed).
    Build { source: PathBuf, jobs: u32 },
}

/// The longest any one application step may take before its run fails.
const STEP_LIMIT: Duration = Duration::from_secs(3600);

/// Runs `command` to its end (at most STEP_LIMIT); its stderr's last lines make the error.
pub(super) fn run(command: Command, what: &str) -> Result<String, String> {
    let done = run_limited(command, STEP_LIMIT).map_err(|e| format!("{what}: {e}"))?;
    if !done.ok {
        return Err(format!(
            "{what} exited ({}): {}",
            done.status,
            last_lines(&done.stderr, 2)
        ));
    }
    Ok(done.stdout)
}

/// A command run in `dir` (git and cp need no special user).
fn command_in(program: &str, dir: &Path) -> Command {
    let mut c = Command::new(program);
    c.current_dir(dir);
    c
}

/// The type and options of the mount holding `dir`, from /proc/self/mounts (whose options
/// include FUSE's allow_other, which mountinfo's per-mount flags do not).
fn mount_of(dir: &Path) -> Option<(String, String)> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 3 && dir.starts_with(f[1])).then(|| (f[1].len(), f[2], f[3]))
        })
        .max_by_key(|(len, ..)| *len)
        .map(|(_, fstype, options)| (fstype.to_owned(), options.to_owned()))
}

/// Whether `app` can run in `dir` (on its mount, and on this machine).
pub fn applicable(app: &App, dir: &Path) -> Result<(), String> {
    match app {
        App::Pgbench { .. } => {
            if let Some((fstype, options)) = mount_of(dir)
                && fstype.starts_with("fuse")
                && !options.split(',').any(|o| o == "allow_other")
            {
                return Err(
                    "mounted without allow_other: only root may use it, and PostgreSQL refuses \
                     to run as root"
                        .into(),
                );
            }
            postgres_bin("pgbench")?;
            user_ids(POSTGRES_USER).map(drop)
        }
        App::Git { .. } | App::Build { .. } => {
            // SAFETY: geteuid has no preconditions.
            if matches!(app, App::Git { .. }) && unsafe { libc::geteuid() } != 0 {
                return Err(
                    "a cold `git status` drops the kernel's caches, which needs root".into(),
                );
            }
            Ok(())
        }
        App::SqliteImport { .. } | App::CopyTree { .. } => Ok(()),
    }
}

/// One run of `app` on `target`, in its directory `dir`; `scratch` is a native directory of
/// the bench's own and `native_tmpfs` the native tmpfs `cp -a` copies back to. Returns a
/// value per metric with what each timed step did, and the raw figures.
pub fn run_app(
    app: &App,
    target: &Target,
    dir: &Path,
    scratch: &Path,
    native_tmpfs: &Path,
) -> Result<(Vec<f64>, Vec<Work>, serde_json::Value), String> {
    let work = dir.join(APP_DIR);
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| format!("cleaning {}: {e}", work.display()))?;
    }
    std::fs::create_dir(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let mut steps = Steps {
        target,
        values: Vec::new(),
        works: Vec::new(),
    };
    let outcome = steps.run(app, &work, scratch, native_tmpfs);
    let _ = std::fs::remove_dir_all(&work);
    let raw = outcome?;
    Ok((steps.values, steps.works, raw))
}

/// The timed steps of one application run: a value and the server's work per step.
struct Steps<'a> {
    target: &'a Target,
    values: Vec<f64>,
    works: Vec<Work>,
}

impl Steps<'_> {
    /// Times `step` as the next metric, counting `ops` operations for it.
    fn measure(
        &mut self,
        ops: f64,
        step: impl FnOnce() -> Result<(), String>,
    ) -> Result<f64, String> {
        let meter = Meter::start(self.target);
        let start = Instant::now();
        step()?;
        let secs = start.elapsed().as_secs_f64();
        self.works.push(meter.work(ops));
        self.values.push(secs);
        Ok(secs)
    }

    fn run(
        &mut self,
        app: &App,
        work: &Path,
        scratch: &Path,
        native_tmpfs: &Path,
    ) -> Result<serde_json::Value, String> {
        Ok(match app {
            App::Pgbench {
                scale,
                clients,
                threads,
                seconds,
            } => {
                let server = Postgres::start(work, scratch)?;
                let rows = f64::from(*scale) * 100_000.0;
                let load = self.measure(rows, || {
                    server
                        .pgbench(&["-i", "-q", "-s", &scale.to_string()])
                        .map(drop)
                })?;
                let mut out = String::new();
                let secs = self.measure(0.0, || {
                    out = server.pgbench(&[
                        "-c",
                        &clients.to_string(),
                        "-j",
                        &threads.to_string(),
                        "-T",
                        &seconds.to_string(),
                    ])?;
                    Ok(())
                })?;
                let tps = parse_tps(&out)?;
                // This metric is a rate: its value is the TPS and its operations the
                // transactions.
                if let (Some(v), Some(w)) = (self.values.last_mut(), self.works.last_mut()) {
                    *v = tps;
                    w.ops = tps * secs;
                }
                server.stop()?;
                json!({"load_s": load, "tps": tps, "pgbench": last_lines(&out, 4)})
            }
            App::SqliteImport { csv, rows } => {
                let db = work.join("import.db");
                let script = format!(
                    "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, \
                     value REAL, note TEXT);\n.mode csv\n.import {} t\n",
                    csv.display()
                );
                let secs = self.measure(*rows as f64, || sqlite_script(&db, &script))?;
                let mut count = command_in("sqlite3", work);
                count.arg(&db).arg("SELECT count(*) FROM t;");
                let count = run(count, "sqlite3 count")?;
                if count.trim() != rows.to_string() {
                    return Err(format!("imported {} rows instead of {rows}", count.trim()));
                }
                json!({"seconds": secs, "rows": rows})
            }
            App::Git { repo, old, files } => {
                let clone = work.join("clone");
                let n = *files as f64;
                let clone_s = self.measure(n, || {
                    let mut c = command_in("git", work);
                    c.args(["clone", "-q", "--no-local"]).arg(repo).arg(&clone);
                    run(c, "git clone").map(drop)
                })?;
                let status = || {
                    let mut c = command_in("git", &clone);
                    c.args(["status", "--porcelain"]);
                    let out = run(c, "git status")?;
                    if out.trim().is_empty() {
                        Ok(())
                    } else {
                        Err(format!("git status found changes: {}", last_lines(&out, 2)))
                    }
                };
                drop_caches()?;
                let cold = self.measure(n, status)?;
                let warm = self.measure(n, status)?;
                let checkout = self.measure(n, || {
                    for rev in [old.as_str(), "-"] {
                        let mut c = command_in("git", &clone);
                        c.args(["checkout", "-q", rev]);
                        run(c, "git checkout")?;
                    }
                    Ok(())
                })?;
                json!({"clone_s": clone_s, "status_cold_s": cold, "status_warm_s": warm,
                    "checkout_s": checkout, "files": files})
            }
            App::CopyTree { tree, files } => {
                let onto = work.join("tree");
                let n = *files as f64;
                let onto_s = self.measure(n, || {
                    let mut c = Command::new("cp");
                    c.arg("-a").arg(tree).arg(&onto);
                    run(c, "cp -a onto the mount").map(drop)
                })?;
                let back = native_tmpfs.join(format!("cp-back-{}", std::process::id()));
                let _ = std::fs::remove_dir_all(&back);
                let copied = self.measure(n, || {
                    let mut c = Command::new("cp");
                    c.arg("-a").arg(&onto).arg(&back);
                    run(c, "cp -a back").map(drop)
                });
                let _ = std::fs::remove_dir_all(&back);
                json!({"onto_s": onto_s, "back_s": copied?, "files": files})
            }
            App::Build { source, jobs } => {
                let build = work.join("build");
                let mut c = Command::new("cp");
                c.arg("-a").arg(source).arg(&build);
                run(c, "copying the source onto the mount")?;
                if build.join("configure").exists() {
                    run(command_in("./configure", &build), "./configure")?;
                }
                let make_s = self.measure(1.0, || {
                    let mut c = command_in("make", &build);
                    c.arg(format!("-j{jobs}"));
                    run(c, "make").map(drop)
                })?;
                json!({"make_s": make_s, "jobs": jobs, "source": source})
            }
        })
    }
}

/// Feeds `script` to `sqlite3 DB` on its standard input (dot-commands such as .import are
/// read from there).
fn sqlite_script(db: &Path, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("sqlite3")
        .arg("-bail")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sqlite3: {e} (apt-get install sqlite3)"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| format!("sqlite3: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("sqlite3: {e}"))?;
    if !out.status.success() || !out.stderr.is_empty() {
        return Err(format!(
            "sqlite3 ({}): {}",
            out.status,
            last_lines(&String::from_utf8_lossy(&out.stderr), 2)
        ));
    }
    Ok(())
}

/// `sync`, then drop the kernel's page, dentry and inode caches (a cold start for what
/// follows; FUSE mounts forget their inodes too).
fn drop_caches() -> Result<(), String> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| format!("drop_caches: {e}"))
}

/// pgbench's "tps = N (without initial connection time)".
fn parse_tps(out: &str) -> Result<f64, String> {
    out.lines()
        .filter(|l| l.starts_with("tps = "))
        .filter_map(|l| l["tps = ".len()..].split_whitespace().next()?.parse().ok())
        .next_back()
        .ok_or_else(|| format!("no tps line in pgbench's output: {}", last_lines(out, 3)))
}

/// A PostgreSQL server of our own: its data directory on the target, its socket in a native
/// scratch directory, no TCP; stopped (fast) when dropped.
struct Postgres {
    data: PathBuf,
    socket_dir: PathBuf,
    running: bool,
}

impl Postgres {
    fn start(work: &Path, scratch: &Path) -> Result<Postgres, String> {
        let (uid, gid) = user_ids(POSTGRES_USER)?;
        let data = work.join("pgdata");
        let socket_dir = scratch.join(format!("pg-socket-{}", std::process::id()));
        for d in [&data, &socket_dir] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            std::os::unix::fs::chown(d, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", d.display()))?;
        }
        std::os::unix::fs::chown(work, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", work.display()))?;
        let mut init = as_postgres(postgres_bin("initdb")?);
        init.arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust"]);
        run(init, "initdb")?;
        let mut server = Postgres {
            data,
            socket_dir,
            running: false,
        };
        let mut start = as_postgres(postgres_bin("pg_ctl")?);
        start
            .arg("-D")
            .arg(&server.data)
            .arg("-l")
            .arg(server.socket_dir.join("log"))
            .arg("-o")
            .arg(format!(
                "-k {} -c listen_addresses='' -p 5432",
                server.socket_dir.display()
            ))
            .args(["-w", "start"]);
        server.running = true;
        run(start, "pg_ctl start").map_err(|e| {
            let log = std::fs::read_to_string(server.socket_dir.join("log")).unwrap_or_default();
            format!("{e}; {}", last_lines(&log, 2))
        })?;
        Ok(server)
    }

    fn pgbench(&self, args: &[&str]) -> Result<String, String> {
        let mut c = as_postgres(postgres_bin("pgbench")?);
        c.arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", "5432", "-U", "postgres"])
            .args(args)
            .arg("postgres");
        run(c, "pgbench")
    }

    fn stop(mut self) -> Result<(), String> {
        self.running = false;
        self.pg_ctl_stop()
    }

    fn pg_ctl_stop(&self) -> Result<(), String> {
        let mut stop = as_postgres(postgres_bin("pg_ctl")?);
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"]);
        run(stop, "pg_ctl stop").map(drop)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl_stop();
        }
        let _ = std::fs::remove_dir_all(&self.socket_dir);
    }
}

/// Extracts `tar` into `dest` once (kept in the cache); returns how many files it holds.
pub fn extracted_tree(tar: &Path, dest: &Path) -> Result<u64, String> {
    if !dest.join(".complete").exists() {
        let _ = std::fs::remove_dir_all(dest);
        std::fs::create_dir_all(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        let mut c = Command::new("tar");
        c.arg("-xf").arg(tar).arg("-C").arg(dest);
        run(c, "tar -xf")?;
        std::fs::write(dest.join(".complete"), "").map_err(|e| e.to_string())?;
    }
    count_files(dest)
}

/// Regular files under `dir` (not following symlinks).
fn count_files(dir: &Path) -> Result<u64, String> {
    let out = run(
        {
            let mut c = Command::new("find");
            c.arg(dir).args(["-type", "f"]);
            c
        },
        "find",
    )?;
    Ok(out.lines().count() as u64)
}

/// A git repository of `tree`'s files in `commits` commits (each adding the next slice of
/// the sorted file list, and every tenth also rewriting a file of each earlier slice), made
/// once into `repo` (a bare repository); returns the commit `old` that `git checkout` jumps
/// to (the tenth) as a hash.
pub fn history_repo(tree: &Path, repo: &Path, commits: usize) -> Result<String, String> {
    let old_file = repo.with_extension("old");
    if let Ok(old) = std::fs::read_to_string(&old_file) {
        return Ok(old.trim().to_owned());
    }
    let _ = std::fs::remove_dir_all(repo);
    let work = repo.with_extension("work");
    let _ = std::fs::remove_dir_all(&work);
    let mut c = Command::new("cp");
    c.arg("-a").arg(tree).arg(&work);
    run(c, "copying the tree for its history")?;
    let _ = std::fs::remove_file(work.join(".complete"));
    let git = |args: &[&str]| -> Result<String, String> {
        let mut c = command_in("git", &work);
        c.args(args)
            .env("GIT_AUTHOR_NAME", "lanefs bench")
            .env("GIT_AUTHOR_EMAIL", "bench@lanefs.invalid")
            .env("GIT_COMMITTER_NAME", "lanefs bench")
            .env("GIT_COMMITTER_EMAIL", "bench@lanefs.invalid")
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z");
        run(c, &format!("git {}", args.first().copied().unwrap_or("")))
    };
    git(&["init", "-q", "-b", "main"])?;
    let mut files: Vec<String> = run(
        {
            let mut c = command_in("find", &work);
            c.args([
                ".", "-path", "./.git", "-prune", "-o", "-type", "f", "-print",
            ]);
            c
        },
        "find",
    )?
    .lines()
    .map(|l| l.trim_start_matches("./").to_owned())
    .collect();
    files.sort();
    let slice = files.len().div_ceil(commits.max(1)).max(1);
    let mut old = String::new();
    for (i, chunk) in files.chunks(slice).enumerate() {
        let list = work.join(".git").join("slice");
        std::fs::write(&list, chunk.join("\n")).map_err(|e| e.to_string())?;
        if i % 10 == 9 {
            // Rewrite one file of each earlier slice: a history with changes, not only adds.
            for earlier in files.chunks(slice).take(i) {
                let path = work.join(&earlier[0]);
                let mut text = std::fs::read(&path).unwrap_or_default();
                let mut line = String::new();
                let _ = writeln!(line, "/* revision {i} */");
                text.extend_from_slice(line.as_bytes());
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            git(&["add", "-u"])?;
        }
        git(&["add", "-f", "--pathspec-from-file=.git/slice"])?;
        git(&["commit", "-q", "--no-verify", "-m", &format!("part {i}")])?;
        if i == 9.min(commits.saturating_sub(1)) {
            old = git(&["rev-parse", "HEAD"])?.trim().to_owned();
        }
    }
    let mut c = Command::new("git");
    c.args(["clone", "-q", "--bare"]).arg(&work).arg(repo);
    run(c, "git clone --bare")?;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::write(&old_file, &old).map_err(|e| e.to_string())?;
    Ok(old)
}

/// A CSV file of `rows` deterministic rows (id, name, value, note), made once.
pub fn csv_rows(path: &Path, rows: u64) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    let part = path.with_extension("part");
    let mut text = String::with_capacity(rows as usize * 48);
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    for id in 1..=rows {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let _ = writeln!(
            text,
            "{id},name-{:08x},{}.{:02},note for row {id} of the lanefs bench",
            rng as u32,
            rng % 100_000,
            rng % 100
        );
    }
    std::fs::write(&part, text).map_err(|e| format!("{}: {e}", part.display()))?;
    std::fs::rename(&part, path).map_err(|e| e.to_string())
}

/// fio's source as Debian ships it (`apt-get source fio` into `dir`, once, through a
/// private source list so the machine's own apt configuration is left alone); returns the
/// unpacked tree.
pub fn debian_source(dir: &Path, package: &str) -> Result<PathBuf, String> {
    if let Some(tree) = unpacked_source(dir, package) {
        return Ok(tree);
    }
    std::fs::create_dir_all(dir.join("lists/partial")).map_err(|e| e.to_string())?;
    let codename = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_owned))
        })
        .unwrap_or_else(|| "bookworm".into());
    let list = dir.join("sources.list");
    std::fs::write(
        &list,
        format!("deb-src http://deb.debian.org/debian {codename} main\n"),
    )
    .map_err(|e| e.to_string())?;
    let apt = |args: &[&str]| {
        let mut c = command_in("apt-get", dir);
        c.arg(format!("-oDir::Etc::SourceList={}", list.display()))
            .arg("-oDir::Etc::SourceParts=/dev/null")
            .arg(format!(
                "-oDir::State::Lists={}",
                dir.join("lists").display()
            ))
            .arg("-oAPT::Sandbox::User=root")
            .args(args);
        run(c, "apt-get")
    };
    apt(&["-qq", "update"])?;
    apt(&["-qq", "source", "--download-only", package])?;
    let orig = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.contains(".orig.tar"))
        })
        .ok_or_else(|| format!("apt-get source {package} brought no .orig tarball"))?;
    let mut c = command_in("tar", dir);
    c.arg("-xf").arg(&orig);
    run(c, "tar -xf")?;
    unpacked_source(dir, package).ok_or_else(|| format!("{} unpacked to nothing", orig.display()))
}

fn unpacked_source(dir: &Path, package: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}-")))
        })
}

/// A small C project (`files` sources and a Makefile), made once: --quick's stand-in for a
/// real one, so that the build step is exercised without a download.
pub fn small_c_project(dir: &Path, files: u32) -> Result<PathBuf, String> {
    let tree = dir.join(format!("small-c-{files}"));
    if tree.join("Makefile").exists() {
        return Ok(tree);
    }
    std::fs::create_dir_all(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    let mut objs = String::new();
    let mut main = String::from("#include <stdio.h>\n");
    for i in 0..files {
        std::fs::write(
            tree.join(format!("f{i}.c")),
            format!(
                "int f{i}(int x) {{ int s = 0; for (int k = 0; k < x; k++) s += k * {i}; return s; }}\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        let _ = write!(objs, " f{i}.o");
        let _ = writeln!(main, "int f{i}(int);");
    }
    main.push_str("int main(void) { int s = 0;\n");
    for i in 0..files {
        let _ = writeln!(main, "  s += f{i}(3);");
    }
    main.push_str("  printf(\"%d\\n\", s); return 0; }\n");
    std::fs::write(tree.join("main.c"), main).map_err(|e| e.to_string())?;
    std::fs::write(
        tree.join("Makefile"),
        format!("prog: main.o{objs}\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) -O2 -c -o $@ $<\n"),
    )
    .map_err(|e| e.to_string())?;
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_tps_is_read_from_its_report() {
        let out = "transaction type: <builtin: TPC-B (sort of)>\nscaling factor: 1\n\
                   latency average = 3.449 ms\ninitial connection time = 5.120 ms\n\
                   tps = 1159.754321 (without initial connection time)\n";
        assert_eq!(parse_tps(out).unwrap(), 1159.754321);
        assert!(parse_tps("pgbench: error: connection refused").is_err());
    }

    #[test]
    fn the_csv_table_has_its_rows_and_is_made_once() {
        let dir = std::env::temp_dir().join(format!("lanefs-apps-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("rows.csv");
        csv_rows(&csv, 1000).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 1000);
        assert!(text.lines().all(|l| l.split(',').count() == 4), "{text}");
        std::fs::write(&csv, "kept").unwrap();
        csv_rows(&csv, 1000).unwrap();
        assert_eq!(std::fs::read_to_string(&csv).unwrap(), "kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
