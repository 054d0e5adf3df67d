//! The run: settings, scratch space (a tmpfs the bench mounts, a directory on disk, mount
//! points), the progress bar, and the loop that measures each workload on each system:
//! warm-up, then repetitions, every run's numbers kept.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use crate::bench::anchors::{self, Anchors, External};
use crate::bench::machine::Machine;
use crate::bench::minio::S3Server;
use crate::bench::model::{self, Row, RunRecord, Status, SuiteResult};
use crate::bench::postgres::{PgServer, Unavailable};
use crate::bench::systems::{self, MountGuard, OpenError, ScratchDir, SystemSpec, Target};
use crate::bench::workloads::Workload;
use crate::bench::{BenchArgs, fio, seconds, signals};

#[derive(Clone, Debug)]
pub struct Settings {
    pub quick: bool,
    pub runtime: Duration,
    pub reps: u32,
    pub warmup: Duration,
    pub cores: usize,
    /// `--system`: the labels' parts that pick the systems run (empty: all).
    pub systems: Vec<String>,
}

impl Settings {
    pub fn from_args(args: &BenchArgs) -> io::Result<Settings> {
        let (runtime, reps, warmup) = if args.quick {
            (0.4, 1, 0.0)
        } else {
            (5.0, 5, 2.0)
        };
        let reps = args.reps.unwrap_or(reps);
        if reps == 0 || reps > 1000 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--reps: use 1..1000",
            ));
        }
        Ok(Settings {
            quick: args.quick,
            runtime: seconds(args.runtime.unwrap_or(runtime), "runtime")?
                .max(Duration::from_millis(100)),
            reps,
            warmup: seconds(args.warmup.unwrap_or(warmup), "warmup")?,
            cores: crate::bench::machine::cores(),
            systems: args.systems.clone(),
        })
    }

    pub fn to_model(&self, args: &BenchArgs, fio: Option<String>) -> model::Settings {
        model::Settings {
            quick: self.quick,
            runtime_s: self.runtime.as_secs_f64(),
            reps: self.reps,
            warmup_s: self.warmup.as_secs_f64(),
            fio,
            lanefs_args: args.lanefs_args.clone(),
        }
    }

    /// 1, 2, 4, ... up to `limit` (and `limit` itself).
    pub fn powers_of_two(from: u32, limit: u32) -> Vec<u32> {
        let mut v = Vec::new();
        let mut n = from.max(1);
        while n < limit {
            v.push(n);
            n *= 2;
        }
        v.push(limit.max(from));
        v.dedup();
        v
    }
}

/// A run stopped by a signal, with what its suite had measured so far.
pub enum Stop {
    Interrupted(Box<SuiteResult>),
}

/// One system and the workloads to run on it (one mount for all of them).
pub struct Plan {
    pub system: SystemSpec,
    pub workloads: Vec<Workload>,
}

pub struct Ctx {
    pub settings: Settings,
    pub machine: Machine,
    pub exe: PathBuf,
    pub lanefs_args: Vec<String>,
    pub fio: Result<(PathBuf, String), String>,
    pub anchors: Anchors,
    pub cache: PathBuf,
    /// Whether lanefs can pass a directory through (None: not tried yet).
    pub passthrough: Option<Result<(), String>>,
    /// The PostgreSQL server the volume's rows on PostgreSQL share (None: not needed yet).
    postgres: Option<Result<PgServer, Unavailable>>,
    /// The MinIO server the volume's rows on S3 share (None: not needed yet).
    s3: Option<Result<S3Server, Unavailable>>,
    pub tmpfs_label: String,
    pub disk_label: String,
    work: PathBuf,
    tmpfs: PathBuf,
    disk: PathBuf,
    tmpfs_guard: Option<MountGuard>,
    next_id: u64,
    notes: Vec<String>,
    pb: ProgressBar,
    settings_model: model::Settings,
}

impl Ctx {
    pub fn new(
        settings: Settings,
        args: &BenchArgs,
        external: HashMap<External, PathBuf>,
    ) -> io::Result<Ctx> {
        let this_exe = std::env::current_exe()?;
        let work = std::env::temp_dir().join(format!("lanefs-bench-{}", std::process::id()));
        std::fs::create_dir_all(&work)?;
        let work = work.canonicalize()?;
        signals::set_scratch(work.clone());
        let disk = work.join("disk");
        std::fs::create_dir_all(&disk)?;
        let machine = Machine::probe();
        let mut notes = Vec::new();
        // The native reference and the backing of every passthrough: a tmpfs of our own,
        // else /dev/shm.
        let tmpfs_mp = work.join("tmpfs");
        std::fs::create_dir_all(&tmpfs_mp)?;
        let (tmpfs, tmpfs_label, tmpfs_guard) =
            match systems::mount_tmpfs(&tmpfs_mp, machine.memory_bytes / 2) {
                Ok(guard) => (tmpfs_mp, "native tmpfs".to_owned(), Some(guard)),
                Err(e) => {
                    let shm = PathBuf::from("/dev/shm")
                        .join(format!("lanefs-bench-{}", std::process::id()));
                    std::fs::create_dir_all(&shm)?;
                    notes.push(format!(
                        "could not mount a tmpfs ({e}); native and backing directories are in {}",
                        shm.display()
                    ));
                    (shm, "native /dev/shm (tmpfs)".to_owned(), None)
                }
            };
        let disk_label = format!("native disk ({})", systems::fs_of(&disk));
        let cache = anchors::cache_dir(&this_exe);
        let exe = match &args.lanefs {
            Some(other) => {
                notes.push(format!("lanefs mounts made by {}", other.display()));
                other.clone()
            }
            None => this_exe,
        };
        let fio = fio::locate(args.fio.as_deref());
        let settings_clone_model = settings.to_model(
            args,
            fio.as_ref()
                .ok()
                .map(|(p, v)| format!("{} ({v})", p.display())),
        );
        let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        Ok(Ctx {
            anchors: Anchors::new(cache.join("anchors"), external),
            settings,
            machine,
            exe,
            lanefs_args: args.lanefs_args.clone(),
            fio,
            cache,
            passthrough: None,
            postgres: None,
            s3: None,
            tmpfs_label,
            disk_label,
            work,
            tmpfs,
            disk,
            tmpfs_guard,
            next_id: 0,
            notes,
            pb,
            settings_model: settings_clone_model,
        })
    }

    pub fn progress_start(&mut self, total: u64) {
        self.pb.set_length(total);
        self.pb.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:32.cyan/blue}] {pos}/{len} runs, eta {eta} {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        self.pb.enable_steady_tick(Duration::from_millis(250));
    }

    pub fn progress_finish(&self) {
        self.pb.finish_and_clear();
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A new empty mount point: a directory, or a regular file for servers that mount on a
    /// file (libfuse's null example, qemu-storage-daemon).
    pub fn new_mountpoint(&mut self, file: bool) -> Result<PathBuf, String> {
        let id = self.id();
        let path = self.work.join(format!("mnt-{id}"));
        let r = if file {
            std::fs::File::create(&path).map(drop)
        } else {
            std::fs::create_dir(&path)
        };
        r.map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    pub fn scratch_tmpfs(&mut self, tag: &str) -> Result<ScratchDir, String> {
        let id = self.id();
        let path = self.tmpfs.join(format!("{tag}-{id}"));
        std::fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(ScratchDir(path))
    }

    pub fn scratch_disk(&mut self, tag: &str) -> Result<ScratchDir, String> {
        let id = self.id();
        let path = self.disk.join(format!("{tag}-{id}"));
        std::fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(ScratchDir(path))
    }

    /// A scratch path outside every measured file system (command output, generated data).
    pub fn work_path(&mut self, name: &str) -> PathBuf {
        let id = self.id();
        self.work.join(format!("{name}-{id}"))
    }

    /// The bench's PostgreSQL server, started on the first call.
    pub fn postgres(&mut self) -> Result<&mut PgServer, Unavailable> {
        if self.postgres.is_none() {
            let started = self
                .scratch_disk("postgres")
                .map_err(Unavailable::Failed)
                .and_then(PgServer::start);
            if let Ok(server) = &started {
                self.notes.push(format!(
                    "PostgreSQL {} for the volume's rows on it: started by the bench, its \
                     data directory on the {} (fsync on, so that a synchronous commit waits \
                     for the disk as a database server's does), reached over loopback TCP; \
                     the volume's blocks are on the bench's tmpfs as the SQLite volume's are",
                    server.version(),
                    self.disk_label
                ));
            }
            self.postgres = Some(started);
        }
        match &mut self.postgres {
            Some(Ok(server)) => Ok(server),
            Some(Err(why)) => Err(why.clone()),
            None => Err(Unavailable::Failed("PostgreSQL was not started".into())),
        }
    }

    /// The bench's MinIO server, started on the first call.
    pub fn s3(&mut self) -> Result<&mut S3Server, Unavailable> {
        if self.s3.is_none() {
            let started = self
                .scratch_disk("minio")
                .map_err(Unavailable::Failed)
                .and_then(S3Server::start);
            if let Ok(server) = &started {
                self.notes.push(format!(
                    "MinIO {} for the volume's rows on S3: started by the bench, its data \
                     on the {} (one bucket, a prefix per volume), reached over loopback HTTP; \
                     its CPU time is not in the rows' server CPU",
                    server.version(),
                    self.disk_label
                ));
            }
            self.s3 = Some(started);
        }
        match &mut self.s3 {
            Some(Ok(server)) => Ok(server),
            Some(Err(why)) => Err(why.clone()),
            None => Err(Unavailable::Failed("MinIO was not started".into())),
        }
    }

    /// The native tmpfs the bench mounted (or /dev/shm's directory standing in for it).
    pub fn tmpfs_dir(&self) -> PathBuf {
        self.tmpfs.clone()
    }

    pub fn log_path(&mut self, name: &str) -> PathBuf {
        self.work_path(&format!("{name}.log"))
    }

    pub fn tools_json(&self) -> Value {
        json!({
            "fio": self.fio.as_ref().map(|(p, v)| json!({"path": p, "version": v}))
                .unwrap_or_else(|e| json!({"missing": e})),
            "libfuse": self.anchors.libfuse_version,
            "libfuse_examples": anchors::examples_dir(),
            "anchor_cache": self.cache.join("anchors"),
            "qemu_storage_daemon": anchors::qemu_storage_daemon().ok().map(|(_, v)| v),
            "anchors_by_path": anchors::External::ALL
                .iter()
                .filter_map(|e| Some((e.name(), self.anchors.external.get(e)?)))
                .collect::<std::collections::BTreeMap<_, _>>(),
            "lanefs_passthrough": match &self.passthrough {
                None => json!("not tried"),
                Some(Ok(())) => json!("available"),
                Some(Err(e)) => json!({"unavailable": e}),
            },
            "tmpfs": self.tmpfs_label,
            "disk": self.disk_label,
            "cpu_clock_tick_s": crate::bench::cpu::resolution_s(),
        })
    }

    pub fn settings_model(&self) -> model::Settings {
        self.settings_model.clone()
    }

    pub fn global_notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// Runs a suite's plan into `suite`: each system is mounted once for all its workloads.
    pub fn execute(&mut self, suite: &mut SuiteResult, plans: Vec<Plan>) -> Result<(), ()> {
        let reps = u64::from(self.settings.reps);
        for plan in plans {
            if signals::interrupted() {
                return Err(());
            }
            let label = plan.system.label(self);
            self.pb
                .set_message(format!("{}: mounting {label}", suite.name));
            let planned = plan.workloads.len() as u64 * reps;
            let target = match plan.system.open(self) {
                Ok(t) => t,
                Err(OpenError::Skip(why)) => {
                    suite.skip(format!("{label}: {why}"));
                    self.pb.inc(planned);
                    continue;
                }
                Err(OpenError::Fail(error)) => {
                    for w in &plan.workloads {
                        let config = plan.system.config(self);
                        push_rows(
                            suite,
                            w,
                            &label,
                            plan.system.role(),
                            config,
                            Status::Failed {
                                error: format!("mounting failed: {error}"),
                            },
                            Vec::new(),
                        );
                    }
                    self.pb.inc(planned);
                    continue;
                }
            };
            for w in &plan.workloads {
                if signals::interrupted() {
                    return Err(());
                }
                if let Err(why) = w.applicable(&target) {
                    suite.skip(format!("{label}, {}: {why}", w.title()));
                    self.pb.inc(reps);
                    continue;
                }
                let (status, runs) = self.measure(suite.name.as_str(), &target, w);
                push_rows(
                    suite,
                    w,
                    &label,
                    target.role,
                    target.config.clone(),
                    status,
                    runs,
                );
                w.cleanup(&target);
            }
            drop(target);
        }
        Ok(())
    }

    /// Warm-up, then the repetitions; stops at the first failure. Returns one list of runs
    /// per metric of the workload.
    fn measure(
        &mut self,
        suite: &str,
        target: &Target,
        w: &Workload,
    ) -> (Status, Vec<Vec<RunRecord>>) {
        let reps = self.settings.reps;
        let mut runs: Vec<Vec<RunRecord>> = vec![Vec::new(); w.metrics.len()];
        self.pb.set_message(format!(
            "{suite}: {} — {} (warm-up)",
            target.label,
            w.title()
        ));
        if !self.settings.warmup.is_zero() {
            let warmup = self.settings.warmup;
            if let Err(error) = w.run(self, target, warmup, true) {
                self.pb.inc(u64::from(reps));
                return (Status::Failed { error }, runs);
            }
        }
        for rep in 0..reps {
            if signals::interrupted() {
                self.pb.inc(u64::from(reps - rep));
                return (
                    Status::Failed {
                        error: "interrupted".into(),
                    },
                    runs,
                );
            }
            self.pb.set_message(format!(
                "{suite}: {} — {} ({}/{reps})",
                target.label,
                w.title(),
                rep + 1
            ));
            let runtime = self.settings.runtime;
            let result = w.run(self, target, runtime, false);
            self.pb.inc(1);
            match result {
                Ok(output) => {
                    for ((list, value), work) in runs.iter_mut().zip(output.values).zip(output.work)
                    {
                        list.push(RunRecord {
                            value,
                            work,
                            raw: output.raw.clone(),
                        });
                    }
                }
                Err(error) => {
                    self.pb.inc(u64::from(reps - rep - 1));
                    return (Status::Failed { error }, runs);
                }
            }
        }
        (Status::Ok, runs)
    }
}

fn push_rows(
    suite: &mut SuiteResult,
    w: &Workload,
    system: &str,
    role: model::Role,
    system_config: Value,
    status: Status,
    mut runs: Vec<Vec<RunRecord>>,
) {
    runs.resize(w.metrics.len(), Vec::new());
    for (metric, runs) in w.metrics.iter().zip(runs) {
        let values: Vec<f64> = runs.iter().map(|r| r.value).collect();
        let (summary, server_cpu) = if status == Status::Ok {
            (model::summarize(&values), model::summarize_cpu(&runs))
        } else {
            (None, None)
        };
        suite.rows.push(Row {
            workload: metric.key.clone(),
            family: metric.family.clone(),
            numjobs: w.numjobs,
            system: system.to_owned(),
            role,
            unit: metric.unit,
            workload_config: w.config.clone(),
            system_config: system_config.clone(),
            status: status.clone(),
            runs,
            summary,
            vs_native: None,
            native: None,
            vs_best_anchor: None,
            best_anchor: None,
            server_cpu,
            cpu_vs_passthrough_hp: None,
            passthrough_hp: None,
        });
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
        // The servers before the tmpfs (no mount uses them by now).
        self.postgres.take();
        self.s3.take();
        // Anything still mounted below the work dir (there should be nothing) goes first.
        let tmpfs = self.tmpfs_guard.as_ref().map(|g| g.mountpoint.clone());
        let mut stray: Vec<PathBuf> = systems::mounts_under(&self.work)
            .filter(|m| Some(m) != tmpfs.as_ref())
            .collect();
        stray.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for mp in stray {
            let _ = systems::lazy_unmount(&mp);
        }
        self.tmpfs_guard.take();
        if !systems::has_mount_under(&self.work) {
            let _ = std::fs::remove_dir_all(&self.work);
        }
        if self.tmpfs_label.contains("/dev/shm") {
            let _ = std::fs::remove_dir_all(&self.tmpfs);
        }
    }
}
