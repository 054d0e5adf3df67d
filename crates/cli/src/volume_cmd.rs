//! `lanefs format`, `fsck`, `gc`, `status`, `dump` and `load`: the volume's own subcommands.

use std::io;
use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Args, Debug)]
pub struct FormatArgs {
    /// The volume's metadata: an SQLite file (created), or a PostgreSQL database as
    /// postgres://user@host:port/db (its password in PGPASSWORD or ~/.pgpass, never here).
    pub volume: PathBuf,
    /// Where the volume's data blocks go: a directory (created if missing; must be empty),
    /// or `s3://BUCKET/PREFIX` (the bucket must exist; credentials from AWS_ACCESS_KEY_ID
    /// and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE and ~/.aws/credentials).
    #[arg(long)]
    pub data: String,
    /// The S3 server's URL, for S3-compatible stores such as MinIO (stored in the volume:
    /// mounts need no flag).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The bucket's region (default us-east-1; stored in the volume).
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// Replace an existing volume file (and the blocks of an earlier volume in the data
    /// directory): everything in them is lost.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// The volume's metadata file.
    pub volume: PathBuf,
    /// Repair what is found (the volume must not be mounted).
    #[arg(long)]
    pub repair: bool,
}

pub fn format(args: FormatArgs) -> io::Result<()> {
    lanefs_volume::volume::keep_host_files_private();
    let data = lanefs_volume::location::DataLocation::from_arg(
        &args.data,
        args.s3_endpoint.as_deref(),
        args.s3_region.as_deref(),
    )
    .map_err(io::Error::other)?;
    let source = args.volume.to_string_lossy();
    let summary = if is_postgres(&args.volume) {
        lanefs_volume::volume::format_postgres(&source, data, args.force)
    } else {
        lanefs_volume::volume::format_at(&args.volume, data, args.force)
    }
    .map_err(io::Error::other)?;
    println!("{summary}");
    Ok(())
}

fn is_postgres(volume: &Path) -> bool {
    lanefs_volume::postgres::is_url(&volume.to_string_lossy())
}

/// The refusal of a command that does not work on a volume on PostgreSQL yet.
fn not_on_postgres(volume: &Path, command: &str) -> io::Result<()> {
    if is_postgres(volume) {
        return Err(io::Error::other(format!(
            "`lanefs {command}` does not work on a volume on PostgreSQL yet (only on SQLite volumes)"
        )));
    }
    Ok(())
}

/// Exit status: success when nothing is wrong (or everything found was repaired).
pub fn fsck(args: FsckArgs) -> io::Result<()> {
    lanefs_volume::volume::keep_host_files_private();
    let report =
        lanefs_volume::fsck::run(&args.volume, args.repair, &mut |line| eprintln!("{line}"))
            .map_err(io::Error::other)?;
    println!("{}", report.summary());
    if report.problems() > 0 && !args.repair {
        return Err(io::Error::other(format!(
            "{} problems found; run `lanefs fsck {} --repair` with the volume unmounted",
            report.problems(),
            args.volume.display()
        )));
    }
    Ok(())
}

pub fn status(volume: &Path) -> io::Result<()> {
    print!(
        "{}",
        lanefs_volume::volume::status(volume).map_err(io::Error::other)?
    );
    Ok(())
}

pub fn gc(volume: &Path) -> io::Result<()> {
    lanefs_volume::volume::keep_host_files_private();
    let deleted = lanefs_volume::fsck::gc(volume).map_err(io::Error::other)?;
    println!("deleted {deleted} unreferenced blocks");
    Ok(())
}

pub fn dump(volume: &Path) -> io::Result<()> {
    not_on_postgres(volume, "dump")?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    lanefs_volume::dump::dump(volume, &mut out).map_err(io::Error::other)?;
    io::Write::flush(&mut out)
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// The new volume file.
    pub volume: PathBuf,
    /// Load a dump that fsck finds problems in, with fsck's repairs (a stale dump's files
    /// whose blocks the volume let go of after it read zeros there); without it such a dump
    /// is refused and nothing is taken over.
    #[arg(long)]
    pub repair: bool,
}

pub fn load(args: LoadArgs) -> io::Result<()> {
    let volume = &args.volume;
    not_on_postgres(volume, "load")?;
    lanefs_volume::volume::keep_host_files_private();
    let stdin = io::stdin();
    let mut input = io::BufReader::new(stdin.lock());
    let repaired =
        lanefs_volume::dump::load(volume, &mut input, args.repair).map_err(io::Error::other)?;
    for problem in &repaired {
        eprintln!("load: repaired: {problem}");
    }
    println!(
        "loaded {}{}",
        volume.display(),
        match repaired.len() {
            0 => String::new(),
            n => format!(" ({n} problems repaired)"),
        }
    );
    Ok(())
}
