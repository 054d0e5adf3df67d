//! The workloads: fio jobs, the seek load generator, bash creates, untar + rm -rf, and dd,
//! run as the bench's user or (fio and creates) as an unprivileged one. Each run returns one
//! number per metric, what it did (operations, and the server's CPU time meanwhile) and the
//! raw figures it came from.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bench::apps::{self, App};
use crate::bench::cpu::ServerCpu;
use crate::bench::fio::{self, FioJob};
use crate::bench::model::{Unit, Work};
use crate::bench::runner::Ctx;
use crate::bench::seek;
use crate::bench::systems::{Place, Target, last_lines};

/// The unprivileged caller's uid and gid: nobody and nogroup.
pub const UNPRIVILEGED_ID: u32 = 65534;
/// The directory, inside the target's, that the unprivileged caller owns and works in.
const UNPRIVILEGED_DIR: &str = "unprivileged";

/// Who runs a workload's commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The bench's own user (root, where it can mount).
    Bench,
    /// uid and gid 65534 without supplementary groups or capabilities (setpriv(1)), in a
    /// directory it owns: issue 11's costs for callers other than root.
    Unprivileged,
}

/// One number a workload reports, and the row it goes to.
#[derive(Clone, Debug)]
pub struct Metric {
    /// The row's workload name, unique within the suite.
    pub key: String,
    /// The chart it is drawn in.
    pub family: String,
    pub unit: Unit,
}

#[derive(Clone, Debug)]
pub enum Kind {
    Fio(FioJob),
    /// Reader threads doing lseek + pread while one writer extends the file.
    Seek {
        readers: u32,
    },
    /// `echo foobarbaz > $DIR/$i` for i in 1..=files, in one bash; `then_list`: then
    /// `ls -l` of them, timed apart (a second value).
    Create {
        files: u32,
        then_list: bool,
    },
    /// Creates in one directory of a volume from `mounts` of its mounts at once: one bash
    /// per mount, each `echo foobarbaz > $DIR/m$K-$i` for i in 1..=files_each; the value is
    /// the aggregate creates per second.
    CreateShared {
        files_each: u32,
        mounts: usize,
    },
    /// `tar xf` of an uncompressed tarball, then `rm -rf` of the tree.
    Untar {
        tar: PathBuf,
        /// Its members (files, directories, links): the operations of each phase; counted
        /// once the tarball is there.
        entries: Option<u64>,
    },
    /// `procs` dd processes writing `mib_each` MiB each in 1 MiB blocks, then reading back.
    Dd {
        procs: u32,
        mib_each: u64,
    },
    /// An application: a database, git, cp -a, a build.
    App(App),
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub metrics: Vec<Metric>,
    pub numjobs: u32,
    pub config: Value,
    pub kind: Kind,
    pub caller: Caller,
}

/// One run's result.
pub struct RunOutput {
    /// One number per metric.
    pub values: Vec<f64>,
    /// Per metric, what the run did for it; None on metrics that describe work another
    /// metric counts (the p99 of the same fio run).
    pub work: Vec<Option<Work>>,
    pub raw: Value,
}

/// Reads the server's CPU time when a phase starts; `work` says what it did once it ended.
pub struct Meter {
    server: Option<ServerCpu>,
    start: Option<f64>,
}

impl Meter {
    pub fn start(target: &Target) -> Meter {
        Meter {
            server: target.server,
            start: target.server.and_then(ServerCpu::seconds),
        }
    }

    /// The server's CPU seconds since the start; None without a server (native).
    fn cpu_s(&self) -> Option<f64> {
        let (server, start) = (self.server?, self.start?);
        server.seconds().map(|end| (end - start).max(0.0))
    }

    pub fn work(&self, ops: f64) -> Work {
        Work {
            ops,
            server_cpu_s: self.cpu_s(),
        }
    }
}

impl Workload {
    pub fn fio(key: String, family: String, unit: Unit, job: FioJob) -> Workload {
        Workload {
            metrics: vec![Metric { key, family, unit }],
            numjobs: job.numjobs,
            config: json!({"tool": "fio", "job": job.config()}),
            kind: Kind::Fio(job),
            caller: Caller::Bench,
        }
    }

    /// The same workload run by the unprivileged caller, in rows of its own.
    pub fn by_unprivileged_user(mut self) -> Workload {
        let suffix = format!(", as uid {UNPRIVILEGED_ID}");
        for m in &mut self.metrics {
            m.key.push_str(&suffix);
            m.family.push_str(&suffix);
        }
        self.config["caller"] = json!({"uid": UNPRIVILEGED_ID, "gid": UNPRIVILEGED_ID,
            "how": "setpriv --reuid --regid --clear-groups"});
        self.caller = Caller::Unprivileged;
        self
    }

    /// The same fio job, also reporting its completion latency's p99 as a second row.
    pub fn with_p99(mut self) -> Workload {
        let rate = self.metrics[0].clone();
        self.metrics.push(Metric {
            key: format!("{}, p99", rate.key),
            family: format!("{} p99", rate.family),
            unit: Unit::MICROS,
        });
        self
    }

    pub fn title(&self) -> &str {
        &self.metrics[0].key
    }

    /// Whether the target can do it at all (a reason for the report when not).
    pub fn applicable(&self, target: &Target) -> Result<(), String> {
        let writes = match &self.kind {
            Kind::Fio(job) => job.writes(),
            Kind::Seek { .. }
            | Kind::Create { .. }
            | Kind::CreateShared { .. }
            | Kind::Untar { .. }
            | Kind::Dd { .. }
            | Kind::App(_) => true,
        };
        if writes && !target.writable {
            return Err("its only file is read-only".into());
        }
        if self.caller == Caller::Unprivileged {
            unprivileged_possible(&self.kind, &target.place)?;
        }
        match (&self.kind, &target.place) {
            (Kind::Fio(job), Place::File(_)) if !job.shared_file => {
                Err("file-per-job needs a directory; this server has one file".into())
            }
            (
                Kind::Create { .. } | Kind::CreateShared { .. } | Kind::Untar { .. } | Kind::App(_),
                Place::File(_),
            ) => Err("it cannot create files".into()),
            (Kind::CreateShared { mounts, .. }, Place::Dir(_))
                if 1 + target.other_mounts.len() < *mounts =>
            {
                Err(format!("it needs {mounts} mounts of one volume"))
            }
            (Kind::App(app), Place::Dir(dir)) => apps::applicable(app, dir),
            _ => Ok(()),
        }
    }

    /// One run. `warmup` runs are not recorded (count-based workloads run whole).
    pub fn run(
        &self,
        ctx: &mut Ctx,
        target: &Target,
        runtime: Duration,
        _warmup: bool,
    ) -> Result<RunOutput, String> {
        let mut output = match &self.kind {
            Kind::Fio(job) => run_fio(ctx, target, job, self.caller, runtime, &self.metrics)?,
            Kind::Seek { readers } => {
                let (file, make) = match &target.place {
                    Place::File(f) => (f.clone(), false),
                    Place::Dir(d) => (d.join("seek.dat"), true),
                };
                let meter = Meter::start(target);
                let r = seek::run(&file, make, *readers, runtime)?;
                let work = meter.work((r.lseeks + r.preads) as f64);
                RunOutput {
                    values: vec![r.seeks_per_s, r.p50_ns / 1000.0, r.p99_ns / 1000.0],
                    work: vec![Some(work)],
                    raw: serde_json::to_value(&r).unwrap_or(Value::Null),
                }
            }
            Kind::Create { files, then_list } => {
                let Place::Dir(dir) = &target.place else {
                    return Err("needs a directory".into());
                };
                let dir = work_dir(dir, self.caller)?;
                run_create(target, &dir, *files, *then_list, self.caller)?
            }
            Kind::CreateShared { files_each, mounts } => {
                let Place::Dir(dir) = &target.place else {
                    return Err("needs a directory".into());
                };
                let mountpoints: Vec<&Path> = std::iter::once(dir.as_path())
                    .chain(target.other_mounts.iter().map(PathBuf::as_path))
                    .take(*mounts)
                    .collect();
                run_create_shared(target, &mountpoints, *files_each)?
            }
            Kind::Untar { tar, entries } => {
                let Place::Dir(dir) = &target.place else {
                    return Err("needs a directory".into());
                };
                run_untar(target, dir, tar, *entries)?
            }
            Kind::Dd { procs, mib_each } => run_dd(target, *procs, *mib_each)?,
            Kind::App(app) => {
                let Place::Dir(dir) = &target.place else {
                    return Err("needs a directory".into());
                };
                let scratch = ctx.work_path("app");
                std::fs::create_dir_all(&scratch)
                    .map_err(|e| format!("{}: {e}", scratch.display()))?;
                let native_tmpfs = ctx.tmpfs_dir();
                let outcome = apps::run_app(app, target, dir, &scratch, &native_tmpfs);
                let _ = std::fs::remove_dir_all(&scratch);
                let (values, works, raw) = outcome?;
                RunOutput {
                    values,
                    work: works.into_iter().map(Some).collect(),
                    raw,
                }
            }
        };
        output.work.resize(self.metrics.len(), None);
        Ok(output)
    }

    /// Removes what the workload left on the target (frees the tmpfs' memory). fio's shared
    /// files stay for the next workload on the same system (no second layout).
    pub fn cleanup(&self, target: &Target) {
        let Place::Dir(dir) = &target.place else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if [
                "fio-job",
                "dd.",
                "seek.dat",
                "create",
                "untar",
                apps::APP_DIR,
                UNPRIVILEGED_DIR,
            ]
            .iter()
            .any(|p| name.starts_with(p))
            {
                let p = e.path();
                let _ = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
}

/// Why the unprivileged caller cannot run `kind` on `place`, if it cannot.
fn unprivileged_possible(kind: &Kind, place: &Place) -> Result<(), String> {
    if !matches!(kind, Kind::Fio(_) | Kind::Create { .. }) {
        return Err("only fio jobs and creates run as the unprivileged caller".into());
    }
    if !matches!(place, Place::Dir(_)) {
        return Err("the unprivileged caller needs a directory of its own".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "the bench does not run as root, so it cannot act as uid {UNPRIVILEGED_ID}"
        ));
    }
    Command::new("setpriv")
        .arg("--version")
        .output()
        .map(drop)
        .map_err(|e| format!("setpriv: {e} (util-linux)"))
}

/// Where the caller works in `dir`: `dir` itself, or for the unprivileged caller a
/// directory it owns there (made and handed over by the bench's user).
fn work_dir(dir: &Path, caller: Caller) -> Result<PathBuf, String> {
    match caller {
        Caller::Bench => Ok(dir.to_path_buf()),
        Caller::Unprivileged => {
            let own = dir.join(UNPRIVILEGED_DIR);
            match std::fs::create_dir(&own) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("{}: {e}", own.display())),
            }
            hand_over(&own)?;
            Ok(own)
        }
    }
}

/// Gives `path` and everything below it to the unprivileged caller.
fn hand_over(path: &Path) -> Result<(), String> {
    let id = Some(UNPRIVILEGED_ID);
    std::os::unix::fs::lchown(path, id, id)
        .map_err(|e| format!("chown {}: {e}", path.display()))?;
    if path.is_dir() && !path.is_symlink() {
        let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for entry in entries.flatten() {
            hand_over(&entry.path())?;
        }
    }
    Ok(())
}

/// `program` as `caller` runs it: directly, or through setpriv as uid/gid 65534 with no
/// supplementary groups (the kernel drops root's capabilities with the uid), from `cwd`.
fn command_as(caller: Caller, program: impl AsRef<OsStr>, cwd: &Path) -> Command {
    match caller {
        Caller::Bench => Command::new(program),
        Caller::Unprivileged => {
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={UNPRIVILEGED_ID}"))
                .arg(format!("--regid={UNPRIVILEGED_ID}"))
                .args(["--clear-groups", "--"])
                .arg(program)
                .current_dir(cwd);
            command
        }
    }
}

/// Output of a finished command: status, stdout, stderr.
pub struct Finished {
    pub ok: bool,
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to its end or until `limit`, then kills it. Output is read on threads so a
/// chatty child never blocks.
pub fn run_limited(mut command: Command, limit: Duration) -> Result<Finished, String> {
    let program = format!("{:?}", command.get_program());
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {program}: {e}"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "{program} did not finish within {} s",
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => break Err(format!("waiting for {program}: {e}")),
        }
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    let status = status?;
    Ok(Finished {
        ok: status.success(),
        status: status.to_string(),
        stdout,
        stderr,
    })
}

fn run_fio(
    ctx: &Ctx,
    target: &Target,
    job: &FioJob,
    caller: Caller,
    runtime: Duration,
    metrics: &[Metric],
) -> Result<RunOutput, String> {
    let (fio_path, _) = ctx.fio.as_ref().map_err(Clone::clone)?;
    let (args, cwd) = match &target.place {
        Place::File(f) => (job.args(Some(f), None, runtime), PathBuf::from("/")),
        Place::Dir(d) => {
            let dir = work_dir(d, caller)?;
            (job.args(None, Some(&dir), runtime), dir)
        }
    };
    if caller == Caller::Unprivileged {
        // Laid out by the bench's user and handed over: a server that does not act as the
        // caller (passthrough_hp) makes its files root's, and default_permissions then
        // refuses the caller's next open of them. A writing job's --create_only leaves an
        // empty file (that the job would unlink and make again), a reading one lays it out.
        let mut layout = Command::new(fio_path);
        layout.args(&args).args(["--rw=read", "--create_only=1"]);
        let done = run_limited(layout, Duration::from_secs(180))?;
        if !done.ok {
            return Err(format!(
                "laying out fio's file ({}): {}",
                done.status,
                last_lines(&done.stderr, 2)
            ));
        }
        hand_over(&cwd)?;
    }
    let mut command = command_as(caller, fio_path, &cwd);
    command.args(&args);
    let meter = Meter::start(target);
    // Laying out files can take a while on a slow server.
    let done = run_limited(command, runtime + Duration::from_secs(180))?;
    let server_cpu_s = meter.cpu_s();
    let parsed = fio::parse(&done.stdout).map_err(|e| {
        let why = last_lines(&done.stderr, 2);
        if done.ok || why.is_empty() {
            e
        } else {
            format!("fio exited ({}): {why}", done.status)
        }
    })?;
    let mut values = vec![if metrics[0].unit == Unit::IOPS {
        parsed.iops()
    } else {
        parsed.mib_per_s()
    }];
    if metrics.len() > 1 {
        // `with_p99`: reads or writes, so the other direction's p99 is 0.
        values.push(parsed.read_clat_p99_ns.max(parsed.write_clat_p99_ns) / 1000.0);
    }
    let mut raw = serde_json::to_value(&parsed).unwrap_or(Value::Null);
    raw["args"] = json!(args);
    Ok(RunOutput {
        values,
        work: vec![Some(Work {
            ops: (parsed.read_ios + parsed.write_ios) as f64,
            server_cpu_s,
        })],
        raw,
    })
}

/// The seed's loop, verbatim but for the directory and count.
const CREATE_SCRIPT: &str =
    r#"for i in `seq 1 "$LANEFS_BENCH_FILES"`; do echo "foobarbaz" > "$LANEFS_BENCH_DIR/$i"; done"#;

fn run_create(
    target: &Target,
    dir: &Path,
    files: u32,
    then_list: bool,
    caller: Caller,
) -> Result<RunOutput, String> {
    let tree = dir.join("create");
    if tree.exists() {
        std::fs::remove_dir_all(&tree).map_err(|e| format!("cleaning {}: {e}", tree.display()))?;
    }
    std::fs::create_dir(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    // Untimed: a file system that answers removes before committing them (lanefs's volume)
    // would otherwise still be committing the previous run's cleanup while this run is
    // timed. The directory's fsync waits for everything answered before it; where a file
    // system has no fsync for directories, nothing was pending anyway.
    let _ = std::fs::File::open(&tree).and_then(|d| d.sync_all());
    if caller == Caller::Unprivileged {
        hand_over(&tree)?;
    }
    let script = |script: &str| {
        let mut command = command_as(caller, "bash", dir);
        command
            .args(["-c", script])
            .env("LANEFS_BENCH_DIR", &tree)
            .env("LANEFS_BENCH_FILES", files.to_string());
        command
    };
    let (secs, work) = timed_script(target, script(CREATE_SCRIPT), files)?;
    let count = std::fs::read_dir(&tree).map(|d| d.count()).unwrap_or(0);
    if count != files as usize {
        return Err(format!("{count} files instead of {files}"));
    }
    let mut output = RunOutput {
        values: vec![secs],
        work: vec![Some(work)],
        raw: json!({"seconds": secs, "files": files, "files_per_s": f64::from(files) / secs}),
    };
    if then_list {
        let (list_secs, list_work) = timed_script(target, script(LIST_SCRIPT), files)?;
        output.values.push(list_secs);
        output.work.push(Some(list_work));
        output.raw["list_seconds"] = json!(list_secs);
    }
    let _ = std::fs::remove_dir_all(&tree);
    Ok(output)
}

/// Runs `command` (a bash script) to its end, timed; its seconds and the server's work for
/// `ops` operations.
fn timed_script(target: &Target, command: Command, ops: u32) -> Result<(f64, Work), String> {
    let meter = Meter::start(target);
    let start = Instant::now();
    let done = run_limited(command, Duration::from_secs(1800))?;
    let secs = start.elapsed().as_secs_f64();
    let work = meter.work(f64::from(ops));
    if !done.ok {
        return Err(format!(
            "bash exited ({}): {}",
            done.status,
            last_lines(&done.stderr, 1)
        ));
    }
    Ok((secs, work))
}

/// `ls -l` of the created files, as a user looks at what was made: READDIRPLUS, and the
/// SELinux label and ACL of each file (two getxattrs).
const LIST_SCRIPT: &str = r#"ls -l "$LANEFS_BENCH_DIR" > /dev/null"#;

/// Seed 003's loop with a prefix per mount, so that mounts never pick the same name.
const CREATE_SHARED_SCRIPT: &str = r#"for i in `seq 1 "$LANEFS_BENCH_FILES"`; do echo "foobarbaz" > "$LANEFS_BENCH_DIR/$LANEFS_BENCH_PREFIX$i"; done"#;

/// How long the other mounts may take to see the directory the first one made.
const SHARED_DIR_VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// One bash per mount creating `files_each` files in the same directory, all started
/// together; the aggregate creates/s from the first start to the last exit.
fn run_create_shared(
    target: &Target,
    mountpoints: &[&Path],
    files_each: u32,
) -> Result<RunOutput, String> {
    let tree = |mp: &Path| mp.join("create-shared");
    let first = tree(mountpoints[0]);
    if first.exists() {
        std::fs::remove_dir_all(&first)
            .map_err(|e| format!("cleaning {}: {e}", first.display()))?;
    }
    std::fs::create_dir(&first).map_err(|e| format!("{}: {e}", first.display()))?;
    for mp in &mountpoints[1..] {
        let start = Instant::now();
        while !tree(mp).is_dir() {
            if start.elapsed() > SHARED_DIR_VISIBLE_WITHIN {
                return Err(format!(
                    "{} made on one mount was not seen on {} within {} s",
                    first.display(),
                    mp.display(),
                    SHARED_DIR_VISIBLE_WITHIN.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let total = u64::from(files_each) * mountpoints.len() as u64;
    let meter = Meter::start(target);
    let start = Instant::now();
    let outcomes: Vec<Result<Finished, String>> = std::thread::scope(|scope| {
        let runs: Vec<_> = mountpoints
            .iter()
            .enumerate()
            .map(|(k, mp)| {
                let mut command = Command::new("bash");
                command
                    .args(["-c", CREATE_SHARED_SCRIPT])
                    .current_dir(mp)
                    .env("LANEFS_BENCH_DIR", tree(mp))
                    .env("LANEFS_BENCH_PREFIX", format!("m{k}-"))
                    .env("LANEFS_BENCH_FILES", files_each.to_string());
                scope.spawn(move || run_limited(command, Duration::from_secs(1800)))
            })
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err("a create thread panicked".into()))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let work = meter.work(total as f64);
    for done in outcomes {
        let done = done?;
        if !done.ok {
            return Err(format!(
                "bash exited ({}): {}",
                done.status,
                last_lines(&done.stderr, 1)
            ));
        }
    }
    let count = std::fs::read_dir(&first).map(|d| d.count()).unwrap_or(0);
    if count as u64 != total {
        return Err(format!("{count} files instead of {total}"));
    }
    let _ = std::fs::remove_dir_all(&first);
    Ok(RunOutput {
        values: vec![total as f64 / secs],
        work: vec![Some(work)],
        raw: json!({"seconds": secs, "mounts": mountpoints.len(), "files_each": files_each,
            "files_per_s": total as f64 / secs}),
    })
}

fn run_untar(
    target: &Target,
    dir: &Path,
    tar: &Path,
    entries: Option<u64>,
) -> Result<RunOutput, String> {
    let tree = dir.join("untar");
    if tree.exists() {
        std::fs::remove_dir_all(&tree).map_err(|e| format!("cleaning {}: {e}", tree.display()))?;
    }
    std::fs::create_dir(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    let mut command = Command::new("tar");
    command.arg("-xf").arg(tar).arg("-C").arg(&tree);
    let meter = Meter::start(target);
    let start = Instant::now();
    let done = run_limited(command, Duration::from_secs(3600))?;
    let untar_s = start.elapsed().as_secs_f64();
    let untar_work = entries.map(|n| meter.work(n as f64));
    if !done.ok {
        let why = tar_error(&done.stderr);
        let _ = std::fs::remove_dir_all(&tree);
        return Err(format!("tar exited ({}): {why}", done.status));
    }
    let mut command = Command::new("rm");
    command.arg("-rf").arg(&tree);
    let meter = Meter::start(target);
    let start = Instant::now();
    let done = run_limited(command, Duration::from_secs(3600))?;
    let rm_s = start.elapsed().as_secs_f64();
    let rm_work = entries.map(|n| meter.work(n as f64));
    if !done.ok {
        return Err(format!(
            "rm -rf exited ({}): {}",
            done.status,
            last_lines(&done.stderr, 1)
        ));
    }
    Ok(RunOutput {
        values: vec![untar_s, rm_s],
        work: vec![untar_work, rm_work],
        raw: json!({"untar_s": untar_s, "rm_s": rm_s, "tarball": tar, "entries": entries}),
    })
}

/// The telling line of tar's complaints: EMFILE if it is among them, else the first
/// "Cannot ..." or "Error ..." line; with the count of such lines.
fn tar_error(stderr: &str) -> String {
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("Cannot") || l.contains("Error"))
        .collect();
    let pick = complaints
        .iter()
        .find(|l| l.contains("Too many open files"))
        .or(complaints.first())
        .map(|l| l.to_string())
        .unwrap_or_else(|| last_lines(stderr, 1));
    if complaints.len() > 1 {
        format!("{pick} (and {} more errors)", complaints.len() - 1)
    } else {
        pick
    }
}

/// Where dd process `i` writes: its own file in a directory, or its own region of the one
/// file a server offers.
fn dd_target(place: &Place, i: u32, mib_each: u64) -> (PathBuf, u64) {
    match place {
        Place::File(f) => (f.clone(), u64::from(i) * mib_each),
        Place::Dir(d) => (d.join(format!("dd.{i}")), 0),
    }
}

fn run_dd(target: &Target, procs: u32, mib_each: u64) -> Result<RunOutput, String> {
    let place = &target.place;
    let total_mib = (u64::from(procs) * mib_each) as f64;
    // Each phase's rate and work: one operation per 1 MiB block.
    let phase = |write: bool| -> Result<(f64, Work), String> {
        let meter = Meter::start(target);
        let start = Instant::now();
        let mut children = Vec::new();
        for i in 0..procs {
            let (path, offset) = dd_target(place, i, mib_each);
            let mut c = Command::new("dd");
            if write {
                c.arg("if=/dev/zero")
                    .arg(format!("of={}", path.display()))
                    .arg(format!("seek={offset}"))
                    .arg("conv=notrunc");
            } else {
                c.arg(format!("if={}", path.display()))
                    .arg("of=/dev/null")
                    .arg(format!("skip={offset}"));
            }
            c.args(["bs=1M", &format!("count={mib_each}"), "status=none"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            match c.spawn() {
                Ok(child) => children.push(child),
                Err(e) => {
                    for mut c in children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(format!("starting dd: {e}"));
                }
            }
        }
        let mut failure = None;
        for child in children {
            match child.wait_with_output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    failure.get_or_insert_with(|| {
                        format!(
                            "dd exited ({}): {}",
                            out.status,
                            last_lines(&String::from_utf8_lossy(&out.stderr), 1)
                        )
                    });
                }
                Err(e) => {
                    failure.get_or_insert_with(|| format!("waiting for dd: {e}"));
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let work = meter.work(total_mib);
        match failure {
            Some(e) => Err(e),
            None => Ok((total_mib / secs, work)),
        }
    };
    let (write, write_work) = phase(true)?;
    let (read, read_work) = phase(false)?;
    Ok(RunOutput {
        values: vec![write, read],
        work: vec![Some(write_work), Some(read_work)],
        raw: json!({"write_mib_s": write, "read_mib_s": read, "procs": procs,
            "mib_each": mib_each}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A scratch directory under /tmp that uid 65534 can reach.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lanefs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn the_unprivileged_caller_works_in_a_directory_it_owns() {
        if !root() {
            eprintln!("skipped: only root can act as uid {UNPRIVILEGED_ID}");
            return;
        }
        let dir = scratch("caller");
        let own = work_dir(&dir, Caller::Unprivileged).unwrap();
        assert_eq!(own, dir.join(UNPRIVILEGED_DIR));
        assert_eq!(own.metadata().unwrap().uid(), UNPRIVILEGED_ID);
        // Root's files made there are handed over, all the way down.
        std::fs::create_dir(own.join("d")).unwrap();
        std::fs::write(own.join("d/f"), b"x").unwrap();
        hand_over(&own).unwrap();
        let f = own.join("d/f").metadata().unwrap();
        assert_eq!((f.uid(), f.gid()), (UNPRIVILEGED_ID, UNPRIVILEGED_ID));
        // The command runs as uid and gid 65534 with no other group, from that directory.
        let mut id = command_as(Caller::Unprivileged, "sh", &own);
        id.args(["-c", "id -u; id -g; id -G; pwd; echo y > d/f && touch new"]);
        let out = id.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..3], ["65534", "65534", "65534"], "{text}");
        assert_eq!(Path::new(lines[3]), own);
        assert_eq!(own.join("new").metadata().unwrap().uid(), UNPRIVILEGED_ID);
        // Root's own directory stays out of its reach.
        let mut denied = command_as(Caller::Unprivileged, "touch", &own);
        denied.arg(dir.join("not-yours"));
        assert!(!denied.status().unwrap().success());
        // The bench's own user runs commands as itself.
        let me = command_as(Caller::Bench, "id", &own)
            .arg("-u")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&me.stdout).trim(), "0");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tar_errors_prefer_emfile() {
        let e = "tar: a: Cannot close: Bad file descriptor\n\
                 tar: b: Cannot open: Too many open files\n\
                 tar: Exiting with failure status due to previous errors\n";
        assert_eq!(
            tar_error(e),
            "tar: b: Cannot open: Too many open files (and 1 more errors)"
        );
        assert_eq!(
            tar_error("tar: x: Cannot utime: ENOSYS\n"),
            "tar: x: Cannot utime: ENOSYS"
        );
        assert_eq!(tar_error("odd\nlast words\n"), "last words");
    }
}
