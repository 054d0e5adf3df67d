//! `lanefs bench`: the seed experiments (../shared/seeds/) side by side with the native file
//! system and existing FUSE servers, as a Markdown report, a JSON document and charts.
//!
//! Layout: `runner` owns the run (settings, temp dirs, progress, the measurement loop),
//! `systems` mounts what is measured (lanefs, native tmpfs/disk, libfuse's examples,
//! qemu-storage-daemon, anchors given by path such as passthrough_hp) behind guards that always
//! unmount, `workloads` drives them (fio, the seek load generator, bash/tar/dd; as root or as
//! an unprivileged user) while `cpu` reads each server's CPU time, `suites` says which
//! workloads meet which systems, and `report`/`chart` write the results.

mod anchors;
mod apps;
mod chart;
mod cpu;
mod fio;
mod machine;
mod minio;
mod model;
mod postgres;
mod report;
mod runner;
mod seek;
mod signals;
mod suites;
mod systems;
mod workloads;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::bench::model::BenchResults;
use crate::bench::runner::{Ctx, Settings};

/// The suites, in the order `lanefs bench` with no names runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Issue 2's benchmark: 4k psync/libaio and the seed 000 shared-file job, lanefs null vs
    /// libfuse's null example.
    Engine,
    /// Seed 000: 1 MiB direct writes, one shared file and file-per-job, numjobs 1..2x cores.
    Ssf,
    /// Seed 001: 4k seq/rand read/write, libaio and psync, 1 vs N queues.
    Queues,
    /// Seed 002: lseek(SEEK_END/SEEK_HOLE) + pread from N threads while a writer extends.
    Seek,
    /// Issue 3's data path: fio 4k buffered and direct on lanefs passthrough with and
    /// without kernel passthrough, native tmpfs and libfuse's passthrough_ll.
    Passthrough,
    /// Issue 4's benchmark: io_uring against cloned /dev/fuse fds (null and passthrough) and
    /// libfuse's clone_fd servers: 4k direct IOPS with p99 latency, and 10,000 creates.
    Transport,
    /// Seed 003: 10,000 `echo foobarbaz > $i` in one bash, then `ls -l` of them.
    Create,
    /// Seed 003: untar of a kernel tree, then rm -rf.
    Untar,
    /// Seed 004: dd with 4..8x cores processes writing, then reading, one mount; and one
    /// sequential 1 MiB stream (fio, 1 job) each way.
    Dd,
    /// Issue 16: applications: PostgreSQL's pgbench, an SQLite import, git, cp -a, a build.
    Apps,
    /// Issue 11's hot path: 4k direct reads and writes and creates on lanefs passthrough
    /// without kernel passthrough, by root and by an unprivileged user, over both transports
    /// (short: for comparing builds with --lanefs; not in the default set).
    Hotpath,
}

impl Suite {
    pub const ALL: [Suite; 10] = [
        Suite::Engine,
        Suite::Ssf,
        Suite::Queues,
        Suite::Seek,
        Suite::Passthrough,
        Suite::Transport,
        Suite::Create,
        Suite::Untar,
        Suite::Dd,
        Suite::Apps,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Suite::Engine => "engine",
            Suite::Ssf => "ssf",
            Suite::Queues => "queues",
            Suite::Seek => "seek",
            Suite::Passthrough => "passthrough",
            Suite::Transport => "transport",
            Suite::Create => "create",
            Suite::Untar => "untar",
            Suite::Dd => "dd",
            Suite::Apps => "apps",
            Suite::Hotpath => "hotpath",
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Suites to run [default: all].
    #[arg(value_enum)]
    pub suites: Vec<Suite>,
    /// Minimal sizes and runtimes, one repetition: checks that every suite works (minutes).
    #[arg(long)]
    pub quick: bool,
    /// Where report.md, results.json and the charts go [default: bench/results/DATE-HOST].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seconds each measured run lasts (fio runtime, seek duration) [default: 5; quick 0.4].
    #[arg(long, value_name = "SECONDS")]
    pub runtime: Option<f64>,
    /// Measured repetitions per configuration [default: 5; quick 1].
    #[arg(long)]
    pub reps: Option<u32>,
    /// Seconds of unrecorded warm-up run before each configuration [default: 2; quick 0].
    #[arg(long, value_name = "SECONDS")]
    pub warmup: Option<f64>,
    /// The fio binary [default: $LANEFS_FIO, else `fio` in PATH].
    #[arg(long, value_name = "PATH")]
    pub fio: Option<PathBuf>,
    /// Extra argument for every `lanefs mount` the bench makes (repeatable), e.g. --poll-us=50.
    #[arg(long = "lanefs-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub lanefs_args: Vec<String>,
    /// An anchor built outside this repository, by path (repeatable): passthrough_hp=PATH
    /// (libfuse's build/example/passthrough_hp), juicefs=PATH [default:
    /// $LANEFS_ANCHOR_PASSTHROUGH_HP, $LANEFS_ANCHOR_JUICEFS]. Without one, its rows are
    /// skipped with a note.
    #[arg(long = "anchor", value_name = "NAME=PATH")]
    pub anchors: Vec<String>,
    /// Run only the systems whose row label contains one of these (repeatable, case
    /// ignored), e.g. `--system "io_uring" --system JuiceFS`; native rows always run. For a
    /// run that must fit in a sitting: the report says which systems were left out.
    #[arg(long = "system", value_name = "TEXT")]
    pub systems: Vec<String>,
    /// Do not print the report on stdout (it is still written to --out).
    #[arg(long)]
    pub no_print: bool,
    /// The lanefs binary that makes the measured lanefs mounts [default: this one], e.g. an
    /// older build to compare with in the same sitting.
    #[arg(long, value_name = "PATH")]
    pub lanefs: Option<PathBuf>,
}

pub fn run(args: BenchArgs) -> io::Result<()> {
    // Before any thread exists: SIGINT/SIGTERM/SIGHUP go to one watcher thread, so that an
    // interrupted run still unmounts everything it mounted.
    signals::install();
    let suites = if args.suites.is_empty() {
        Suite::ALL.to_vec()
    } else {
        let mut s = args.suites.clone();
        s.dedup();
        s
    };
    let settings = Settings::from_args(&args)?;
    let external = anchors::external_paths(&args.anchors)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let started = machine::now_utc();
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => PathBuf::from("bench/results").join(format!(
            "{}-{}",
            started.date_compact(),
            machine::hostname()
        )),
    };
    std::fs::create_dir_all(&out)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", out.display())))?;
    let out = out.canonicalize()?;

    let mut ctx = Ctx::new(settings, &args, external)?;
    let mut results = BenchResults::new(&ctx, started, &suites);
    let total: u64 = suites.iter().map(|s| suites::planned_runs(*s, &ctx)).sum();
    ctx.progress_start(total);
    let mut interrupted = false;
    for suite in &suites {
        match suites::run(*suite, &mut ctx) {
            Ok(result) => results.suites.push(result),
            Err(runner::Stop::Interrupted(partial)) => {
                results.suites.push(*partial);
                interrupted = true;
                break;
            }
        }
    }
    ctx.progress_finish();
    results.finish(&ctx, interrupted);
    // Unmount and remove the scratch space before writing (and before charts take time).
    drop(ctx);

    model::compute_ratios(&mut results);
    let charts = chart::write_all(&results, &out);
    results.charts = charts.files;
    results.notes.extend(charts.notes);
    let markdown = report::markdown(&results);
    std::fs::write(out.join("report.md"), &markdown)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results).map_err(io::Error::other)?,
    )?;
    if !args.no_print {
        println!("{markdown}");
    }
    eprintln!("lanefs bench: wrote {}", out.display());
    if interrupted {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "interrupted; the partial results were written",
        ));
    }
    Ok(())
}

/// A duration from (possibly fractional) seconds, for the CLI's settings.
fn seconds(value: f64, what: &str) -> io::Result<Duration> {
    if !value.is_finite() || !(0.0..=3600.0).contains(&value) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--{what} {value}: use 0..3600 seconds"),
        ));
    }
    Ok(Duration::from_secs_f64(value))
}
