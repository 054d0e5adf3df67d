//! `lanefs mount`, its mount(8) form, the daemon mode, and `lanefs umount`.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use clap::{Args, Parser};
use lanefs_fs::null::{NullFs, NullOptions};
use lanefs_fs::passthrough::{Atime, AtimeRule, PassthroughFs, PassthroughOptions};
use lanefs_fuse::mount::{self, MountSpec};
use lanefs_fuse::session::{self, MAX_MAX_WRITE, Mounted};
use lanefs_fuse::{Filesystem, Labels, SessionOptions};
use lanefs_volume::fs::{VolumeFs, VolumeOptions};

use crate::options;

/// Set in the environment of the re-executed daemon: its stdout is the readiness pipe.
const DAEMON_CHILD_ENV: &str = "LANEFS_DAEMON_CHILD";

#[derive(Args, Debug)]
pub struct MountArgs {
    /// `null:` for the null file system, a host directory to pass through, or a volume
    /// made by `lanefs format` (an SQLite file, or a postgres://user@host:port/db URL).
    pub source: String,
    /// An existing empty directory to mount on (not already a FUSE mount).
    pub mountpoint: PathBuf,
    /// Run in the background; return once the mount is ready.
    #[arg(long, short = 'd')]
    pub daemon: bool,
    /// How requests reach the daemon: `uring` (one io_uring per CPU, Linux 6.14+ with
    /// /sys/module/fuse/parameters/enable_uring = Y), `dev` (cloned /dev/fuse fds), or `auto`
    /// (io_uring when the kernel offers it) [default: auto].
    #[arg(long, value_name = "auto|uring|dev")]
    pub transport: Option<lanefs_fuse::Transport>,
    /// io_uring entries per CPU: requests one CPU's queue holds at once, 1..128 [default: 4].
    #[arg(long, value_name = "N")]
    pub queue_depth: Option<usize>,
    /// /dev/fuse transport: worker threads, each with its own cloned fd [default: online
    /// CPUs].
    #[arg(long)]
    pub queues: Option<usize>,
    /// /dev/fuse transport: pin each worker to a CPU, spread over NUMA nodes (io_uring
    /// workers are always pinned, each to its ring's CPU).
    #[arg(long)]
    pub pin: bool,
    /// Serialise direct writes to a file (seed 000 off, for A/B runs).
    #[arg(long)]
    pub no_parallel_writes: bool,
    /// Size of null's `data` file [default: 1T].
    #[arg(long, value_parser = options::parse_size)]
    pub size: Option<u64>,
    /// Largest write request, 4k..1M [default: 1M].
    #[arg(long, value_parser = options::parse_size)]
    pub max_write: Option<u64>,
    /// Background requests the kernel keeps in flight [default: 128].
    #[arg(long)]
    pub max_background: Option<u16>,
    /// Microseconds an idle worker keeps polling its queue (yielding its CPU) before sleeping
    /// [default: 50 over io_uring, where a sleeping worker makes the scheduler move the caller
    /// to another CPU on every round trip; 0 over /dev/fuse]
    #[arg(long, value_name = "MICROSECONDS")]
    pub poll_us: Option<u64>,
    /// Let other users use the mount (always on as root).
    #[arg(long)]
    pub allow_other: bool,
    /// Let the kernel check permissions from file modes (always on as root).
    #[arg(long)]
    pub default_permissions: bool,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Honour set-user-id bits (off by default, like fusermount).
    #[arg(long)]
    pub suid: bool,
    /// Honour device files (off by default, like fusermount).
    #[arg(long)]
    pub dev: bool,
    /// Refuse to execute programs from the mount.
    #[arg(long)]
    pub noexec: bool,
    /// Never update access times on the mount.
    #[arg(long)]
    pub noatime: bool,
    /// The mount's source as shown by df and findmnt [default: SOURCE].
    #[arg(long)]
    pub fsname: Option<String>,
    /// Where the daemon logs [default: nowhere].
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Passthrough: every open bypasses the page cache (direct I/O), as O_DIRECT opens do.
    #[arg(long)]
    pub direct_io: bool,
    /// Passthrough: serve all file I/O in the daemon, no kernel passthrough.
    #[arg(long)]
    pub no_passthrough: bool,
    /// Passthrough: seconds the kernel may cache attributes [default: 1.0].
    #[arg(long, value_name = "SECS", value_parser = options::parse_seconds)]
    pub attr_timeout: Option<f64>,
    /// Passthrough: seconds the kernel may cache names, present or absent [default: 1.0].
    #[arg(long, value_name = "SECS", value_parser = options::parse_seconds)]
    pub entry_timeout: Option<f64>,
    /// Passthrough: at most N fds kept open for known inodes [default: 4096].
    #[arg(long, value_name = "N")]
    pub fd_cache: Option<usize>,
    /// Passthrough: do not negotiate FUSE_HANDLE_KILLPRIV_V2 (the kernel then asks for
    /// security.capability before every write; for A/B runs).
    #[arg(long)]
    pub no_killpriv_v2: bool,
    /// Passthrough: keep an O_PATH fd per known inode instead of its file handle.
    #[arg(long)]
    pub no_file_handles: bool,
    /// Passthrough and volume: send no FLUSH at close(2) (two round trips fewer per `echo x >
    /// f`). The price: on a passthrough, POSIX locks stay in the kernel, unseen by processes
    /// on the host; on a volume, data is committed after close returns, which then no
    /// longer reports a failed commit (an fsync before it still does).
    #[arg(long)]
    pub no_flush_on_close: bool,
    /// Volume: the size statfs (df) reports [default: the data directory's file system's].
    #[arg(long, value_parser = options::parse_size)]
    pub capacity: Option<u64>,
    /// Volume: the memory that written bytes not yet stored may hold, for all files
    /// together; past it writers wait while the files holding most are flushed [default: an
    /// eighth of the machine's memory, within 64 MiB..1 GiB]. Each file also flushes past
    /// 64 MiB (or 64 chunks of 1 MiB that its writes touched), and the writeback stores what
    /// waited 5 s.
    #[arg(long, value_parser = options::parse_size)]
    pub dirty_max: Option<u64>,
    /// Volume on PostgreSQL: answer a change once PostgreSQL has it, before its WAL is on
    /// the disk (as SQLite volumes do); fsync, fsyncdir and syncfs still wait for the disk.
    #[arg(long)]
    pub async_commit: bool,
    /// Volume: wait for the commit of every create, mkdir, unlink and rmdir before answering
    /// it (for A/B runs). By default a volume answers those it can before they commit (on
    /// PostgreSQL, in directories whose lease this mount holds); fsync and close report a
    /// commit that then failed. `-o sync` and `-o dirsync` imply it.
    #[arg(long)]
    pub no_async_dirops: bool,
    /// Volume: the local directory of the session's intent log, the changes answered before
    /// their commit, which the next mount on this machine applies after a crash [default:
    /// beside an SQLite database (`DB-intent`), /var/lib/lanefs/intent/VOLUME-ID for
    /// PostgreSQL].
    #[arg(long, value_name = "DIR")]
    pub intent_dir: Option<PathBuf>,
    /// Volume: at most N changes answered before their commit wait for it at once; past
    /// that a change waits for room (up to a second), and with none (the database stuck),
    /// the intent log full or the database gone, changes are answered after their commit
    /// until the database catches up [default: 32768].
    #[arg(long, value_name = "N")]
    pub async_backlog: Option<u64>,
    /// Volume on PostgreSQL: how long operations wait for a database that went away before
    /// they fail with EIO; after one such wait in vain they fail at once until it is back
    /// [default: 30].
    #[arg(long, value_name = "SECS", value_parser = options::parse_seconds)]
    pub db_wait: Option<f64>,
    /// Options in mount(8) form: transport=uring,queue_depth=N,queues=N,pin,size=1T,ro,...
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Generic MS_* flags from `-o` (sync, dirsync, nodiratime, strictatime, ...), beyond
    /// the ones with a `--flag` above.
    #[arg(skip)]
    pub vfs_flags: libc::c_ulong,
    /// `-o remount`: change the flags of the mount at MOUNTPOINT instead of mounting.
    #[arg(skip)]
    pub remount: bool,
    /// Run by mount(8) (`lanefs SOURCE MOUNTPOINT -o ...`): print nothing on success.
    #[arg(skip)]
    pub helper_form: bool,
    /// Fault injection for the engine's tests: null panics when this name is looked up.
    #[arg(long, hide = true)]
    pub panic_on_lookup: Option<String>,
    /// For the engine's tests: null answers each read from another thread.
    #[arg(long, hide = true)]
    pub defer_reads: bool,
    /// For the engine's tests: null answers each read from another thread after this many
    /// milliseconds (the request stays parked meanwhile).
    #[arg(long, hide = true, value_name = "MS")]
    pub defer_reads_ms: Option<u64>,
}

#[derive(Parser)]
#[command(name = "lanefs", no_binary_name = true)]
struct FstabForm {
    #[command(flatten)]
    args: MountArgs,
    /// Foreground (mount.fuse3 never passes it; for debugging the fstab form).
    #[arg(short = 'f')]
    foreground: bool,
}

/// Recognises `lanefs SOURCE MOUNTPOINT -o ...`, the form mount.fuse3 runs; it daemonizes.
pub fn fstab_form(argv: &[String]) -> Option<MountArgs> {
    let first = argv.get(1)?;
    let subcommands = [
        "mount", "umount", "stats", "bench", "format", "fsck", "gc", "status", "dump", "load",
        "help",
    ];
    if first.starts_with('-') || subcommands.contains(&first.as_str()) || argv.len() < 3 {
        return None;
    }
    let form = FstabForm::try_parse_from(&argv[1..]).unwrap_or_else(|e| e.exit());
    let mut args = form.args;
    args.daemon = !form.foreground;
    args.helper_form = true;
    Some(args)
}

pub fn run(mut args: MountArgs) -> io::Result<()> {
    let lists = std::mem::take(&mut args.options);
    options::apply(&mut args, &lists).map_err(invalid)?;
    if args.remount {
        return remount(&args);
    }
    let child = std::env::var_os(DAEMON_CHILD_ENV).is_some();
    if !child {
        // Said once, by the process whose stderr the user sees.
        for limit in options::limits_of(args.vfs_flags) {
            tracing::warn!("{limit}");
        }
        refuse_open_allow_other(&args)?;
    }
    if args.daemon && !child {
        // What can be refused without mounting is refused here, where the caller's terminal
        // sees the reason (the daemon's stderr is its log).
        check_source(&args.source)?;
        session_options(&args)?;
        return spawn_daemon(&args);
    }
    let result = mount_and_serve(args, child);
    if let Err(e) = &result
        && child
    {
        // Before the mount is ready this reaches the waiting parent; after it, stdout is
        // /dev/null and the error goes to the log through the caller of `run`.
        report_ready(&format!("ERR {e}"));
    }
    result
}

/// A SOURCE that is clearly a typo gets a hint before anything else is tried.
fn check_source(source: &str) -> io::Result<()> {
    if source == "null" && !Path::new(source).exists() {
        return Err(invalid(
            "SOURCE `null` is not a directory here: did you mean `null:` (the null file system)?",
        ));
    }
    Ok(())
}

fn mount_and_serve(args: MountArgs, child: bool) -> io::Result<()> {
    check_source(&args.source)?;
    let mountpoint = mount::absolute(&args.mountpoint)?;
    let source = args.source.clone();
    let session_options = session_options(&args)?;
    let spec = mount_spec(&args, &mountpoint);
    // Opened before the daemon leaves its working directory, so a relative SOURCE works, and
    // before mounting, so a bad SOURCE is refused with nothing mounted.
    let source_fs = open_source(&args, &mountpoint)?;
    if child {
        // Do not keep the caller's working directory (and its file system) busy.
        std::env::set_current_dir("/")?;
    }
    // The mount line goes to the terminal only in the foreground `lanefs mount` form; a
    // mount helper prints nothing on success (it would land in scripts' output), so there
    // it goes to the log.
    let helper_form = args.helper_form;
    let ready = move |mounted: &Mounted| {
        if child {
            tracing::info!("{}", mounted.line);
            report_ready(&format!("OK {}", mounted.line));
        } else if helper_form {
            tracing::info!("{}", mounted.line);
        } else {
            println!("{}", mounted.line);
        }
    };
    match source_fs {
        SourceFs::Passthrough(fs) => {
            let remounted = fs.clone();
            // The watcher starts before the mount is reported: whoever saw the report (a
            // script that remounts at once, a test counting the daemon's threads) finds the
            // daemon whole.
            let ready = move |mounted: &Mounted| {
                follow_remounts(&mounted.mountpoint, move |atime| remounted.set_atime(atime));
                ready(mounted);
            };
            serve(
                Arc::new(fs),
                &spec,
                &session_options,
                &source,
                "passthrough",
                ready,
            )
        }
        // The volume's lock is the file system's: let go at the end of its destroy.
        SourceFs::Volume(fs) => {
            let switch = fs.atime_switch();
            let ready = move |mounted: &Mounted| {
                // A read-only mount moves no atime (the kernel's rule for its own).
                follow_remounts(&mounted.mountpoint, move |atime| {
                    switch.set(atime);
                });
                ready(mounted);
            };
            serve(fs, &spec, &session_options, &source, "volume", ready)
        }
        SourceFs::Null => {
            let fs = NullFs::new(NullOptions {
                size: args.size.unwrap_or(NullOptions::default().size),
                parallel_writes: !args.no_parallel_writes,
                panic_on_lookup: args.panic_on_lookup.clone(),
                defer_reads: args
                    .defer_reads_ms
                    .map(std::time::Duration::from_millis)
                    .or(args.defer_reads.then_some(std::time::Duration::ZERO)),
            });
            serve(
                Arc::new(fs),
                &spec,
                &session_options,
                &source,
                "null",
                ready,
            )
        }
    }
}

/// The file system a SOURCE names.
enum SourceFs {
    Null,
    Passthrough(PassthroughFs),
    Volume(Arc<VolumeFs>),
}

/// `null:` → null; a regular file → a volume (an SQLite file made by `lanefs format`), or a
/// sentence saying what was expected; anything else → the passthrough, which explains
/// itself when SOURCE is not a directory.
fn open_source(args: &MountArgs, mountpoint: &Path) -> io::Result<SourceFs> {
    let source = &args.source;
    if source == "null:" {
        return Ok(SourceFs::Null);
    }
    let pg = lanefs_volume::postgres::is_url(source);
    if pg || Path::new(source).is_file() {
        if !pg && !lanefs_volume::volume::looks_like_volume(Path::new(source)) {
            return Err(invalid(format!(
                "{source} is a file but not a lanefs volume; SOURCE must be a directory (passthrough), `null:`, or a volume made by `lanefs format`"
            )));
        }
        if args.async_commit && !pg {
            return Err(invalid(
                "--async-commit is for volumes on PostgreSQL (an SQLite volume's commits never wait for the disk; fsync does)",
            ));
        }
        if let Some(max) = args.dirty_max
            && max < lanefs_volume::file::DirtyBudget::MIN_CAP_BYTES
        {
            return Err(invalid(format!(
                "--dirty-max {max} is too small: a volume needs at least {} bytes (4 MiB) for its writers' unstored chunks",
                lanefs_volume::file::DirtyBudget::MIN_CAP_BYTES
            )));
        }
        if args.db_wait.is_some() && !pg {
            return Err(invalid(
                "--db-wait is for volumes on PostgreSQL (an SQLite volume's database is a local file)",
            ));
        }
        lanefs_volume::volume::keep_host_files_private();
        let mut options = VolumeOptions {
            capacity: args.capacity,
            parallel_writes: !args.no_parallel_writes,
            atime: atime_of(options::mount_flags(args)),
            flush_on_close: !args.no_flush_on_close,
            async_dirops: !args.no_async_dirops
                && options::mount_flags(args) & (libc::MS_SYNCHRONOUS | libc::MS_DIRSYNC) == 0,
            intent_dir: args.intent_dir.clone(),
            database_wait: args.db_wait.map(std::time::Duration::from_secs_f64),
            dirty_max: args.dirty_max,
            ..VolumeOptions::default()
        };
        if let Some(n) = args.async_backlog {
            options.async_backlog = n;
        }
        if let Some(secs) = args.attr_timeout {
            options.attr_timeout = std::time::Duration::from_secs_f64(secs);
        }
        if let Some(secs) = args.entry_timeout {
            options.entry_timeout = std::time::Duration::from_secs_f64(secs);
        }
        let fs = if pg {
            lanefs_volume::volume::open_for_mount_postgres(
                source,
                mountpoint,
                options,
                args.async_commit,
            )
        } else {
            lanefs_volume::volume::open_for_mount(Path::new(source), mountpoint, options)
        }
        .map_err(io::Error::other)?;
        return Ok(SourceFs::Volume(fs));
    }
    PassthroughFs::new(passthrough_options(args)).map(SourceFs::Passthrough)
}

fn serve<F: Filesystem>(
    fs: Arc<F>,
    spec: &MountSpec,
    opts: &SessionOptions,
    source: &str,
    filesystem: &str,
    ready: impl FnOnce(&Mounted),
) -> io::Result<()> {
    let labels = Labels {
        source: source.to_owned(),
        filesystem: filesystem.to_owned(),
    };
    session::run(fs, spec, opts, labels, ready)
}

fn passthrough_options(args: &MountArgs) -> PassthroughOptions {
    let mut opts = PassthroughOptions::new(args.source.clone().into());
    opts.direct_io = args.direct_io;
    opts.passthrough = !args.no_passthrough;
    opts.parallel_writes = !args.no_parallel_writes;
    if let Some(secs) = args.attr_timeout {
        opts.attr_timeout = std::time::Duration::from_secs_f64(secs);
    }
    if let Some(secs) = args.entry_timeout {
        opts.entry_timeout = std::time::Duration::from_secs_f64(secs);
    }
    if let Some(n) = args.fd_cache {
        opts.fd_cache = n;
    }
    opts.killpriv_v2 = !args.no_killpriv_v2;
    opts.file_handles = !args.no_file_handles;
    opts.flush_on_close = !args.no_flush_on_close;
    opts.atime = atime_of(options::mount_flags(args));
    opts
}

/// Applies the atime flags of a remount (`mount -o remount,noatime`, however made) to the
/// file system (`apply`): the passthrough's own reads, the volume's rule.
fn follow_remounts(mountpoint: &Path, apply: impl Fn(Atime) + Send + 'static) {
    let watched = mount::find_mount(mountpoint)
        .and_then(|info| info.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
        .and_then(|info| {
            mount::watch_mount_options((info.major, info.minor), move |options| {
                let atime = atime_of_mountinfo(options);
                tracing::info!("remounted ({options}): atime {atime:?}");
                apply(atime)
            })
        });
    if let Err(e) = watched {
        tracing::warn!("cannot follow remounts of {}: {e}", mountpoint.display());
    }
}

/// The atime rule of a mount's mountinfo options: `noatime`, `relatime`, or neither
/// (strictatime), and `nodiratime`. A read-only mount moves no atime (`atime_needs_update`).
fn atime_of_mountinfo(options: &str) -> Atime {
    let has = |name: &str| options.split(',').any(|o| o == name);
    let rule = if has("noatime") || has("ro") {
        AtimeRule::Never
    } else if has("relatime") {
        AtimeRule::Relative
    } else {
        AtimeRule::Always
    };
    Atime {
        rule,
        directories: !has("nodiratime"),
    }
}

/// The atime rule that the mount flags `flags` (MS_*) give, as the kernel reads them.
fn atime_of(flags: libc::c_ulong) -> Atime {
    let rule = if flags & (libc::MS_NOATIME | libc::MS_RDONLY) != 0 {
        AtimeRule::Never
    } else if flags & libc::MS_STRICTATIME != 0 {
        AtimeRule::Always
    } else {
        AtimeRule::Relative
    };
    Atime {
        rule,
        directories: flags & libc::MS_NODIRATIME == 0,
    }
}

fn session_options(args: &MountArgs) -> io::Result<SessionOptions> {
    let mut opts = SessionOptions::default();
    if let Some(queues) = args.queues {
        if queues == 0 || queues > 1024 {
            return Err(invalid(format!("--queues {queues}: use 1..1024")));
        }
        opts.queues = queues;
    }
    opts.pin = args.pin;
    if let Some(transport) = args.transport {
        opts.transport = transport;
    }
    if let Some(depth) = args.queue_depth {
        if !(1..=lanefs_fuse::uring::MAX_QUEUE_DEPTH).contains(&depth) {
            return Err(invalid(format!(
                "--queue-depth {depth}: use 1..{}",
                lanefs_fuse::uring::MAX_QUEUE_DEPTH
            )));
        }
        opts.queue_depth = depth;
    }
    if let Some(max_write) = args.max_write {
        if !(4096..=MAX_MAX_WRITE as u64).contains(&max_write) || max_write % 4096 != 0 {
            return Err(invalid(format!(
                "--max-write {max_write}: use a multiple of 4k from 4k to 1M"
            )));
        }
        opts.max_write = max_write as u32;
    }
    if let Some(poll_us) = args.poll_us {
        opts.poll = Some(std::time::Duration::from_micros(poll_us.min(1_000_000)));
    }
    if let Some(max_background) = args.max_background {
        opts.max_background = max_background.max(1);
    }
    Ok(opts)
}

fn mount_spec(args: &MountArgs, mountpoint: &Path) -> MountSpec {
    let root = is_root();
    MountSpec {
        mountpoint: mountpoint.to_owned(),
        fsname: args.fsname.clone().unwrap_or_else(|| args.source.clone()),
        allow_other: args.allow_other || root,
        // The volume leaves permission checks to the kernel (modes, owners, groups).
        default_permissions: args.default_permissions || root || is_volume_source(&args.source),
        flags: options::mount_flags(args),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A regular user's passthrough with --allow-other but without --default-permissions would
/// let every other user reach SOURCE with the mounting user's rights (the kernel checks
/// nothing, and the daemon, running as that user, is allowed what that user is): refused,
/// with the fix. (As root both are always on; null has nothing to protect.)
fn refuse_open_allow_other(args: &MountArgs) -> io::Result<()> {
    if args.allow_other && !args.default_permissions && args.source != "null:" && !is_root() {
        return Err(invalid(
            "--allow-other without --default-permissions would give every user of this machine \
             your own access to the files under SOURCE; add --default-permissions (the kernel \
             then checks each caller against the files' modes)",
        ));
    }
    Ok(())
}

/// `-o remount,...`: applies the flags to the existing mount at MOUNTPOINT, as mount(8) does
/// for kernel file systems (mount(2) with MS_REMOUNT: read-only, sync, atime, nosuid, ... of
/// the mount and its superblock). What only a new daemon could change (queues, SOURCE, ...)
/// stays as it is.
fn remount(args: &MountArgs) -> io::Result<()> {
    let mountpoint = mount::absolute(&args.mountpoint)?;
    let flags = options::mount_flags(args);
    for limit in options::limits_of(args.vfs_flags) {
        tracing::warn!("{limit}");
    }
    mount::remount(&mountpoint, flags)
}

fn is_volume_source(source: &str) -> bool {
    lanefs_volume::postgres::is_url(source)
        || Path::new(source).is_file()
            && lanefs_volume::volume::looks_like_volume(Path::new(source))
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

/// The daemon tells its parent how mounting went on its stdout (a pipe), then points stdout
/// at /dev/null so the parent sees end-of-file.
fn report_ready(line: &str) {
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: both fds are open; dup2 atomically replaces fd 1.
        unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
    }
}

/// Re-executes this command in a new session with its stdout as a pipe, and waits until the
/// child says the mount is ready (or why it is not).
fn spawn_daemon(args: &MountArgs) -> io::Result<()> {
    let log = match &args.log {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("log file {}: {e}", path.display()))
                })?,
        ),
        None => Stdio::null(),
    };
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(std::env::args_os().skip(1))
        .env(DAEMON_CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let mut report = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut report)?;
    let report = report.trim_end();
    if let Some(line) = report.strip_prefix("OK ") {
        if !args.helper_form {
            println!("{line} (daemon pid {})", child.id());
        }
        return Ok(());
    }
    let status = child.wait()?;
    match report.strip_prefix("ERR ") {
        Some(msg) => Err(io::Error::other(msg.to_owned())),
        None => Err(io::Error::other(format!(
            "the daemon exited ({status}) before the mount was ready{}",
            args.log
                .as_ref()
                .map(|l| format!("; see {}", l.display()))
                .unwrap_or_default()
        ))),
    }
}

/// How long `lanefs umount` waits for the daemon to finish after unmounting.
const DAEMON_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Unmounts, then waits for the daemon to finish (its control socket goes last), so that a
/// script that unmounts can rely on the daemon having flushed and exited.
pub fn umount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mountpoint = mount::absolute(mountpoint)?;
    let info = match mount::find_mount(&mountpoint)? {
        Some(info) if info.fstype.starts_with("fuse") => info,
        Some(info) => {
            return Err(invalid(format!(
                "{} is a {} mount, not a FUSE one",
                mountpoint.display(),
                info.fstype
            )));
        }
        None => {
            return Err(invalid(format!(
                "{} is not a mount point",
                mountpoint.display()
            )));
        }
    };
    // Our mount only: whatever sits on it (stacked on MOUNTPOINT, or mounted inside) would
    // be detached with it by a lazy unmount, and makes a plain one fail.
    let above = mount::mounts_on(info.id)?;
    if let Some(other) = above.first() {
        return Err(invalid(format!(
            "{} has {} mounted on it ({} on {}): unmount that first",
            mountpoint.display(),
            if above.len() == 1 {
                "another file system".to_string()
            } else {
                format!("{} other file systems", above.len())
            },
            other.fstype,
            other.mountpoint.display()
        )));
    }
    let socket = lanefs_fuse::control::socket_path(&info);
    // Held before the unmount: after it, the daemon may be gone, its pid reused.
    let daemon = (info.fstype == mount::FSTYPE && !lazy)
        .then(|| lanefs_fuse::control::Daemon::of_socket(&socket))
        .flatten();
    mount::unmount(&mountpoint, lazy)?;
    // Until its process has exited: the control socket closes before the file system's
    // files do (a volume's database, intent log and data directory), and a script that
    // unmounts the file system holding them right after found it busy.
    if let Some(daemon) = daemon
        && !daemon.wait_exit(DAEMON_EXIT_WAIT)
    {
        eprintln!(
            "lanefs: unmounted {}, but its daemon has not exited after {DAEMON_EXIT_WAIT:?}",
            mountpoint.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atime_rules_from_flags_and_from_mountinfo_agree() {
        let rule = |a: Atime| (a.rule, a.directories);
        for (flags, options, expected) in [
            (0, "rw,nosuid,relatime", (AtimeRule::Relative, true)),
            (libc::MS_NOATIME, "rw,noatime", (AtimeRule::Never, true)),
            (libc::MS_STRICTATIME, "rw,nosuid", (AtimeRule::Always, true)),
            (
                libc::MS_STRICTATIME | libc::MS_NODIRATIME,
                "rw,nodiratime",
                (AtimeRule::Always, false),
            ),
            (
                libc::MS_RDONLY | libc::MS_STRICTATIME,
                "ro",
                (AtimeRule::Never, true),
            ),
            (
                libc::MS_NODIRATIME,
                "rw,nodiratime,relatime",
                (AtimeRule::Relative, false),
            ),
        ] {
            assert_eq!(rule(atime_of(flags)), expected, "{flags:#x}");
            assert_eq!(rule(atime_of_mountinfo(options)), expected, "{options}");
        }
    }
}
