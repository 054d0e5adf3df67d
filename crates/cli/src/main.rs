//! The `lanefs` command.

mod bench;
mod mount_cmd;
mod options;
mod stats_cmd;
mod volume_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lanefs",
    version,
    about = "A FUSE file system that keeps scaling: many queues, parallel writes, seeks that never wait",
    after_help = "Also invoked by mount(8) as `lanefs SOURCE MOUNTPOINT -o OPTIONS` (type fuse.lanefs): that form runs as a daemon."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a file system: `null:` (the overhead probe), a host directory (passthrough), or a
    /// volume made by `lanefs format`.
    Mount(mount_cmd::MountArgs),
    /// Unmount a lanefs mount; its daemon then exits.
    Umount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; the daemon exits once they are closed.
        #[arg(long, short = 'l')]
        lazy: bool,
    },
    /// Show a mount's per-operation counts and latencies, protocol and queues.
    Stats {
        mountpoint: PathBuf,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark lanefs against native file systems and existing FUSE servers (the seeds).
    Bench(bench::BenchArgs),
    /// Make a new volume: metadata in an SQLite file or a PostgreSQL database, data in a
    /// directory.
    /// Example: `lanefs format ./vol.db --data ./vol-data`, then `lanefs mount ./vol.db /mnt/vol`.
    Format(volume_cmd::FormatArgs),
    /// Check a volume that is not mounted (and repair it with --repair).
    /// Example: `lanefs fsck ./vol.db --repair`.
    Fsck(volume_cmd::FsckArgs),
    /// Show a volume: its settings, sessions (mounts) and usage. Works while it is mounted.
    Status { volume: PathBuf },
    /// Delete the blocks no file refers to from a volume that is not mounted.
    Gc { volume: PathBuf },
    /// Write a volume's metadata (not mounted) as JSON to stdout: `lanefs dump vol.db > vol.json`.
    Dump { volume: PathBuf },
    /// Make a new volume file from a dump on stdin: `lanefs load new.db < vol.json`. It uses the
    /// dumped volume's data directory.
    Load(volume_cmd::LoadArgs),
}

fn main() -> ExitCode {
    init_logging();
    let args: Vec<String> = std::env::args().collect();
    let result = match mount_cmd::fstab_form(&args) {
        Some(mount_args) => mount_cmd::run(mount_args),
        None => match Cli::parse().command {
            Command::Mount(mount_args) => mount_cmd::run(mount_args),
            Command::Umount { mountpoint, lazy } => mount_cmd::umount(&mountpoint, lazy),
            Command::Stats { mountpoint, json } => stats_cmd::run(&mountpoint, json),
            Command::Bench(bench_args) => bench::run(bench_args),
            Command::Format(format_args) => volume_cmd::format(format_args),
            Command::Fsck(fsck_args) => volume_cmd::fsck(fsck_args),
            Command::Status { volume } => volume_cmd::status(&volume),
            Command::Gc { volume } => volume_cmd::gc(&volume),
            Command::Dump { volume } => volume_cmd::dump(&volume),
            Command::Load(args) => volume_cmd::load(args),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanefs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr (the daemon's is the --log file); LANEFS_LOG sets the filter. Colours
/// only on a terminal: a log file or a pipe gets plain text. object_store logs every retry
/// of an S3 request at info (during an outage, one line per request every few hundred ms):
/// by default only its warnings, as the volume logs one line when a request finally fails.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("LANEFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,object_store=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
