//! The systems a bench measures, mounted behind guards: every mount is unmounted (lazily if
//! busy) and every server stopped when its guard drops, on success, error, panic or Ctrl-C.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lanefs_fuse::mount;
use serde_json::{Value, json};

use crate::bench::anchors::{self, Example, External};
use crate::bench::cpu::ServerCpu;
use crate::bench::model::Role;
use crate::bench::postgres::Unavailable;
use crate::bench::runner::Ctx;
use crate::bench::signals;
use crate::bench::workloads::run_limited;

/// How a libfuse example runs: `-s`, the default multi-threaded loop, or that with clone_fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Single,
    Multi,
    CloneFd,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Single, Mode::Multi, Mode::CloneFd];

    fn label(self) -> &'static str {
        match self {
            Mode::Single => "-s",
            Mode::Multi => "mt",
            Mode::CloneFd => "mt clone_fd",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Mode::Single => &["-s"],
            Mode::Multi => &[],
            Mode::CloneFd => &["-o", "clone_fd"],
        }
    }
}

#[derive(Clone, Debug)]
pub enum SystemSpec {
    LanefsNull {
        queues: usize,
        parallel_writes: bool,
        /// `--size` of `data` [lanefs' default: 1T].
        size: Option<&'static str>,
    },
    LanefsPassthrough {
        queues: usize,
        parallel_writes: bool,
        /// Kernel passthrough of opens without O_DIRECT (off: `--no-passthrough`).
        kernel_passthrough: bool,
        /// Over io_uring with this many entries per ring (then `queues` is unused: one ring
        /// per CPU); None: `queues` cloned /dev/fuse fds.
        uring_depth: Option<usize>,
    },
    /// lanefs null over io_uring (one ring per CPU, `depth` entries each); skipped when the
    /// kernel has io_uring off (the bench never turns it on).
    LanefsNullUring {
        depth: usize,
    },
    NativeTmpfs,
    NativeDisk,
    Libfuse {
        example: Example,
        mode: Mode,
    },
    /// qemu-storage-daemon's FUSE export of its null-co driver (`null`) or of a raw file.
    Qsd {
        null: bool,
    },
    /// libfuse's passthrough_hp (`--anchor passthrough_hp=PATH`) over a tmpfs directory, over
    /// io_uring or on cloned /dev/fuse fds, with kernel passthrough or `--nopassthrough`.
    PassthroughHp {
        uring: bool,
        kernel_passthrough: bool,
    },
    /// lanefs's volume on its embedded defaults (SQLite metadata, blocks in a local
    /// directory), both on the bench's tmpfs, over io_uring (one ring per CPU, the default
    /// depth) or `queues` cloned /dev/fuse fds; with directory operations answered before
    /// their commit (the default) or not (`--no-async-dirops`).
    LanefsVolume {
        queues: usize,
        uring: bool,
        async_dirops: bool,
    },
    /// lanefs's volume on the bench's PostgreSQL (its metadata; blocks in a local directory
    /// on the bench's tmpfs, or with `s3` in a prefix of the bench's MinIO bucket), over
    /// io_uring or `queues` cloned /dev/fuse fds, with `--async-commit` or not, directory
    /// operations answered early under leases (the default) or not (`--no-async-dirops`),
    /// mounted `mounts` times (separate daemons, as separate machines would mount it);
    /// skipped with a note where PostgreSQL (or MinIO) is not installed.
    LanefsVolumePg {
        queues: usize,
        uring: bool,
        async_commit: bool,
        async_dirops: bool,
        mounts: usize,
        s3: bool,
    },
    /// JuiceFS with SQLite metadata and a local directory as its object store
    /// (`--anchor juicefs=PATH`), formatted for each configuration, with its defaults.
    JuiceFs,
}

impl SystemSpec {
    pub fn label(&self, ctx: &Ctx) -> String {
        match self {
            SystemSpec::LanefsNull {
                queues,
                parallel_writes,
                ..
            } => format!(
                "lanefs null {queues}q{}",
                if *parallel_writes { "" } else { " no-pw" }
            ),
            SystemSpec::LanefsPassthrough {
                queues,
                parallel_writes,
                kernel_passthrough,
                uring_depth,
            } => format!(
                "lanefs passthrough {}{}{}",
                match uring_depth {
                    Some(depth) => format!("io_uring d{depth}"),
                    None => format!("{queues}q"),
                },
                if *parallel_writes { "" } else { " no-pw" },
                if *kernel_passthrough {
                    ""
                } else {
                    " no-passthrough"
                }
            ),
            SystemSpec::LanefsNullUring { depth } => format!("lanefs null io_uring d{depth}"),
            SystemSpec::LanefsVolume {
                queues,
                uring,
                async_dirops,
            } => format!(
                "lanefs volume {}{}",
                if *uring {
                    format!("io_uring d{}", lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH)
                } else {
                    format!("{queues}q")
                },
                if *async_dirops {
                    ""
                } else {
                    " no-async-dirops"
                }
            ),
            SystemSpec::LanefsVolumePg {
                queues,
                uring,
                async_commit,
                async_dirops,
                mounts,
                s3,
            } => format!(
                "lanefs volume on PostgreSQL {}{}{}{}{}",
                if *s3 { "+ S3 " } else { "" },
                if *uring {
                    format!("io_uring d{}", lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH)
                } else {
                    format!("{queues}q")
                },
                if *async_commit { " async-commit" } else { "" },
                if *async_dirops {
                    ""
                } else {
                    " no-async-dirops"
                },
                if *mounts > 1 {
                    format!(", {mounts} mounts")
                } else {
                    String::new()
                }
            ),
            SystemSpec::NativeTmpfs => ctx.tmpfs_label.clone(),
            SystemSpec::NativeDisk => ctx.disk_label.clone(),
            SystemSpec::Libfuse { example, mode } => {
                format!("libfuse {} {}", example.name(), mode.label())
            }
            SystemSpec::Qsd { null: true } => "qemu-storage-daemon null-co".into(),
            SystemSpec::Qsd { null: false } => "qemu-storage-daemon raw file".into(),
            SystemSpec::PassthroughHp {
                uring,
                kernel_passthrough,
            } => format!(
                "passthrough_hp {}{}",
                if *uring { "io_uring" } else { "clone-fd" },
                if *kernel_passthrough {
                    ""
                } else {
                    " no-passthrough"
                }
            ),
            SystemSpec::JuiceFs => "JuiceFS (SQLite, local directory)".into(),
        }
    }

    pub fn role(&self) -> Role {
        match self {
            SystemSpec::LanefsNull { .. }
            | SystemSpec::LanefsPassthrough { .. }
            | SystemSpec::LanefsNullUring { .. }
            | SystemSpec::LanefsVolume { .. }
            | SystemSpec::LanefsVolumePg { .. } => Role::Lanefs,
            SystemSpec::NativeTmpfs | SystemSpec::NativeDisk => Role::Native,
            SystemSpec::Libfuse { .. }
            | SystemSpec::Qsd { .. }
            | SystemSpec::PassthroughHp { .. }
            | SystemSpec::JuiceFs => Role::Anchor,
        }
    }

    pub fn config(&self, ctx: &Ctx) -> Value {
        match self {
            SystemSpec::LanefsNull {
                queues,
                parallel_writes,
                size,
            } => json!({"system": "lanefs", "fs": "null", "queues": queues,
                "parallel_writes": parallel_writes, "size": size.unwrap_or("1T"),
                "extra_args": ctx.lanefs_args, "transport": "/dev/fuse"}),
            SystemSpec::LanefsPassthrough {
                queues,
                parallel_writes,
                kernel_passthrough,
                uring_depth,
            } => json!({"system": "lanefs", "fs": "passthrough",
                "queues": match uring_depth {
                    Some(_) => possible_cpus(),
                    None => *queues,
                },
                "queue_depth": uring_depth,
                "parallel_writes": parallel_writes, "kernel_passthrough": kernel_passthrough,
                "backing": ctx.tmpfs_label, "extra_args": ctx.lanefs_args,
                "transport": if uring_depth.is_some() { "io_uring" } else { "/dev/fuse" }}),
            SystemSpec::LanefsNullUring { depth } => json!({"system": "lanefs", "fs": "null",
                "queues": possible_cpus(),
                "queue_depth": depth, "extra_args": ctx.lanefs_args, "transport": "io_uring"}),
            SystemSpec::LanefsVolume {
                queues,
                uring,
                async_dirops,
            } => json!({"system": "lanefs",
                "fs": "volume", "metadata": "SQLite", "data": "local directory",
                "async_dirops": async_dirops,
                "queues": if *uring { possible_cpus() } else { *queues },
                "queue_depth": uring.then_some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH),
                "backing": ctx.tmpfs_label, "extra_args": ctx.lanefs_args,
                "transport": if *uring { "io_uring" } else { "/dev/fuse" }}),
            SystemSpec::LanefsVolumePg {
                queues,
                uring,
                async_commit,
                async_dirops,
                mounts,
                s3,
            } => json!({"system": "lanefs",
                "fs": "volume", "metadata": "PostgreSQL",
                "data": if *s3 { "S3 (MinIO)" } else { "local directory" },
                "async_commit": async_commit, "async_dirops": async_dirops, "mounts": mounts,
                "postgres_data": ctx.disk_label,
                "s3_data": s3.then_some(&ctx.disk_label),
                "queues": if *uring { possible_cpus() } else { *queues },
                "queue_depth": uring.then_some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH),
                "backing": ctx.tmpfs_label, "extra_args": ctx.lanefs_args,
                "transport": if *uring { "io_uring" } else { "/dev/fuse" }}),
            SystemSpec::NativeTmpfs => json!({"system": "native", "fs": ctx.tmpfs_label}),
            SystemSpec::NativeDisk => json!({"system": "native", "fs": ctx.disk_label}),
            SystemSpec::Libfuse { example, mode } => json!({"system": "libfuse",
            "example": example.name(), "args": mode.args(),
            "libfuse": ctx.anchors.libfuse_version, "backing": match example {
                Example::PassthroughLl | Example::PassthroughFh => Some(&ctx.tmpfs_label),
                _ => None,
            }}),
            SystemSpec::Qsd { null } => json!({"system": "qemu-storage-daemon",
                "driver": if *null { "null-co" } else { "file" }}),
            SystemSpec::PassthroughHp {
                uring,
                kernel_passthrough,
            } => json!({"system": "passthrough_hp",
                "path": ctx.anchors.external.get(&External::PassthroughHp),
                "args": passthrough_hp_args(*uring, *kernel_passthrough),
                "transport": if *uring { "io_uring" } else { "/dev/fuse, clone_fd" },
                "kernel_passthrough": kernel_passthrough, "backing": ctx.tmpfs_label}),
            SystemSpec::JuiceFs => json!({"system": "juicefs", "meta": "sqlite3",
                "storage": "local directory", "args": juicefs_mount_args(),
                "path": ctx.anchors.external.get(&External::JuiceFs),
                "backing": ctx.tmpfs_label}),
        }
    }

    /// Mounts (or prepares) the system.
    pub fn open(&self, ctx: &mut Ctx) -> Result<Target, OpenError> {
        let label = self.label(ctx);
        let config = self.config(ctx);
        let role = self.role();
        let target = |place, writable, guards: Vec<Guard>| Target {
            label: label.clone(),
            role,
            config: config.clone(),
            place,
            writable,
            server: guards.iter().find_map(|g| match g {
                Guard::Mount(m) => m.server_pid().map(|pid| ServerCpu { pid }),
                Guard::Dir(_) => None,
            }),
            other_mounts: Vec::new(),
            guards,
        };
        match self {
            SystemSpec::NativeTmpfs => {
                let dir = ctx.scratch_tmpfs("native").map_err(OpenError::Fail)?;
                Ok(target(
                    Place::Dir(dir.0.clone()),
                    true,
                    vec![Guard::Dir(dir)],
                ))
            }
            SystemSpec::NativeDisk => {
                let dir = ctx.scratch_disk("native").map_err(OpenError::Fail)?;
                Ok(target(
                    Place::Dir(dir.0.clone()),
                    true,
                    vec![Guard::Dir(dir)],
                ))
            }
            SystemSpec::LanefsNull {
                queues,
                parallel_writes,
                size,
            } => {
                let mut args = transport_args(*queues, None)?;
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                if !parallel_writes {
                    args.push("--no-parallel-writes".into());
                }
                if let Some(size) = size {
                    args.extend(["--size".to_owned(), (*size).to_owned()]);
                }
                let guard = mount_lanefs(ctx, &args, "null:", &mp, &[]).map_err(OpenError::Fail)?;
                Ok(target(
                    Place::File(mp.join("data")),
                    true,
                    vec![Guard::Mount(guard)],
                ))
            }
            SystemSpec::LanefsNullUring { depth } => {
                let args = transport_args(0, Some(*depth))?;
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                let guard = mount_lanefs(ctx, &args, "null:", &mp, &[]).map_err(OpenError::Fail)?;
                Ok(target(
                    Place::File(mp.join("data")),
                    true,
                    vec![Guard::Mount(guard)],
                ))
            }
            SystemSpec::LanefsPassthrough {
                queues,
                parallel_writes,
                kernel_passthrough,
                uring_depth,
            } => {
                if let Some(Err(why)) = &ctx.passthrough {
                    return Err(OpenError::Skip(why.clone()));
                }
                let mut args = transport_args(*queues, *uring_depth)?;
                let src = ctx.scratch_tmpfs("lanefs-src").map_err(OpenError::Fail)?;
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                if !parallel_writes {
                    args.push("--no-parallel-writes".into());
                }
                if !kernel_passthrough {
                    args.push("--no-passthrough".into());
                }
                let source = src.0.display().to_string();
                match mount_lanefs(ctx, &args, &source, &mp, &[]) {
                    Ok(guard) => {
                        ctx.passthrough = Some(Ok(()));
                        Ok(target(
                            Place::Dir(mp),
                            true,
                            vec![Guard::Dir(src), Guard::Mount(guard)],
                        ))
                    }
                    Err(e) if ctx.passthrough.is_none() => {
                        let why = format!(
                            "lanefs passthrough is not available here (`lanefs mount DIR MP`: {})",
                            e.replace(&source, "DIR")
                        );
                        ctx.passthrough = Some(Err(why.clone()));
                        Err(OpenError::Skip(why))
                    }
                    Err(e) => Err(OpenError::Fail(e)),
                }
            }
            SystemSpec::LanefsVolume {
                queues,
                uring,
                async_dirops,
            } => {
                let depth = uring.then_some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH);
                let mut args = transport_args(*queues, depth)?;
                if !*async_dirops {
                    args.push("--no-async-dirops".into());
                }
                let dir = ctx.scratch_tmpfs("volume").map_err(OpenError::Fail)?;
                let db = dir.0.join("vol.db");
                format_volume(ctx, &db, dir.0.join("data").as_os_str(), &[], &[])
                    .map_err(OpenError::Fail)?;
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                let guard = mount_lanefs(ctx, &args, &db.display().to_string(), &mp, &[])
                    .map_err(OpenError::Fail)?;
                Ok(target(
                    Place::Dir(mp),
                    true,
                    vec![Guard::Dir(dir), Guard::Mount(guard)],
                ))
            }
            SystemSpec::LanefsVolumePg {
                queues,
                uring,
                async_commit,
                async_dirops,
                mounts,
                s3,
            } => {
                let depth = uring.then_some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH);
                let mut args = transport_args(*queues, depth)?;
                if *async_commit {
                    args.push("--async-commit".into());
                }
                if !*async_dirops {
                    args.push("--no-async-dirops".into());
                }
                let unavailable = |server: &str, why| match why {
                    Unavailable::NotInstalled(why) => OpenError::Skip(why),
                    Unavailable::Failed(why) => OpenError::Fail(format!("{server}: {why}")),
                };
                // The bucket's prefix, its endpoint and the credentials, on S3.
                let s3_access = if *s3 {
                    let server = ctx.s3().map_err(|why| unavailable("MinIO", why))?;
                    Some((
                        server.new_prefix("vol"),
                        server.endpoint(),
                        server.credentials(),
                    ))
                } else {
                    None
                };
                let url = ctx
                    .postgres()
                    .map_err(|why| unavailable("PostgreSQL", why))?
                    .createdb("vol")
                    .map_err(OpenError::Fail)?;
                let dir = ctx.scratch_tmpfs("volume-pg").map_err(OpenError::Fail)?;
                let (data, format_args, env): (OsString, _, &[(&str, &str)]) = match &s3_access {
                    Some((prefix, endpoint, credentials)) => (
                        prefix.into(),
                        vec!["--s3-endpoint".to_owned(), endpoint.clone()],
                        &credentials[..],
                    ),
                    None => (dir.0.join("data").into_os_string(), Vec::new(), &[][..]),
                };
                format_volume(ctx, Path::new(&url), &data, &format_args, env)
                    .map_err(OpenError::Fail)?;
                let mut guards = vec![Guard::Dir(dir)];
                let mut mountpoints = Vec::new();
                for _ in 0..*mounts {
                    let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                    let guard =
                        mount_lanefs(ctx, &args, &url, &mp, env).map_err(OpenError::Fail)?;
                    guards.push(Guard::Mount(guard));
                    mountpoints.push(mp);
                }
                let mut mountpoints = mountpoints.into_iter();
                let first = mountpoints
                    .next()
                    .ok_or_else(|| OpenError::Fail("no mounts asked for".into()))?;
                let mut t = target(Place::Dir(first), true, guards);
                t.other_mounts = mountpoints.collect();
                if !t.other_mounts.is_empty() {
                    // One daemon's CPU time would be half the story.
                    t.server = None;
                }
                Ok(t)
            }
            SystemSpec::Libfuse { example, mode } => {
                let binary = ctx.anchors.get(*example).map_err(OpenError::Skip)?;
                let (mp, place, writable, backing) = match example {
                    Example::Null => {
                        let mp = ctx.new_mountpoint(true).map_err(OpenError::Fail)?;
                        (mp.clone(), Place::File(mp), true, None)
                    }
                    Example::PassthroughLl | Example::PassthroughFh => {
                        let src = ctx.scratch_tmpfs("libfuse-src").map_err(OpenError::Fail)?;
                        let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                        let place = if *example == Example::PassthroughFh {
                            // passthrough_fh mirrors all of /.
                            Place::Dir(mp.join(src.0.strip_prefix("/").unwrap_or(&src.0)))
                        } else {
                            Place::Dir(mp.clone())
                        };
                        (mp, place, true, Some(src))
                    }
                };
                let mut command = Command::new(&binary);
                command.arg("-f").args(mode.args());
                if let (Example::PassthroughLl, Some(src)) = (example, &backing) {
                    command.arg("-o").arg(format!("source={}", src.0.display()));
                }
                command.arg(&mp);
                let log = ctx.log_path(example.name());
                let guard = spawn_server(command, &mp, &log, false).map_err(OpenError::Fail)?;
                let mut guards = Vec::new();
                guards.extend(backing.map(Guard::Dir));
                guards.push(Guard::Mount(guard));
                Ok(target(place, writable, guards))
            }
            SystemSpec::Qsd { null } => {
                let (binary, _) = anchors::qemu_storage_daemon().map_err(OpenError::Skip)?;
                let mp = ctx.new_mountpoint(true).map_err(OpenError::Fail)?;
                let mut guards = Vec::new();
                let blockdev = if *null {
                    "driver=null-co,node-name=n0,size=4G,read-zeroes=on".to_owned()
                } else {
                    let dir = ctx.scratch_tmpfs("qsd").map_err(OpenError::Fail)?;
                    let raw = dir.0.join("disk.raw");
                    File::create(&raw)
                        .and_then(|f| f.set_len(4 << 30))
                        .map_err(|e| OpenError::Fail(format!("{}: {e}", raw.display())))?;
                    guards.push(Guard::Dir(dir));
                    format!("driver=file,node-name=n0,filename={}", raw.display())
                };
                let mut command = Command::new(binary);
                command
                    .arg("--blockdev")
                    .arg(blockdev)
                    .arg("--export")
                    .arg(format!(
                        "type=fuse,id=e0,node-name=n0,mountpoint={},writable=on",
                        mp.display()
                    ));
                let log = ctx.log_path("qemu-storage-daemon");
                let guard = spawn_server(command, &mp, &log, true).map_err(OpenError::Fail)?;
                guards.push(Guard::Mount(guard));
                Ok(target(Place::File(mp), true, guards))
            }
            SystemSpec::PassthroughHp {
                uring,
                kernel_passthrough,
            } => {
                let binary = ctx
                    .anchors
                    .external(External::PassthroughHp)
                    .map_err(OpenError::Skip)?;
                if *uring && let Some(why) = lanefs_fuse::uring::KernelSupport::read().obstacle() {
                    return Err(OpenError::Skip(why));
                }
                let src = ctx.scratch_tmpfs("hp-src").map_err(OpenError::Fail)?;
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                let mut command = Command::new(&binary);
                command
                    .args(passthrough_hp_args(*uring, *kernel_passthrough))
                    .arg(&src.0)
                    .arg(&mp);
                let log = ctx.log_path("passthrough_hp");
                // A server given by path that does not start is skipped, as a missing one is.
                let guard = spawn_server(command, &mp, &log, false).map_err(OpenError::Skip)?;
                Ok(target(
                    Place::Dir(mp),
                    true,
                    vec![Guard::Dir(src), Guard::Mount(guard)],
                ))
            }
            SystemSpec::JuiceFs => {
                let binary = ctx
                    .anchors
                    .external(External::JuiceFs)
                    .map_err(OpenError::Skip)?;
                // Its metadata, blocks and block cache on the bench's tmpfs, as the lanefs
                // volume's SQLite file and blocks are.
                let dir = ctx.scratch_tmpfs("juicefs").map_err(OpenError::Fail)?;
                let meta = format!("sqlite3://{}", dir.0.join("meta.db").display());
                // Without its trash (by default a removed file's blocks stay a day): the
                // lanefs volume frees them at once, and the rows run one after another on
                // one formatted JuiceFS on a bounded tmpfs, which the apps suite's removed
                // databases, clones and trees filled (12 GiB by its `cp -a` row), failing
                // the later rows with ENOSPC.
                let mut format = Command::new(&binary);
                format
                    .args([
                        "format",
                        "--trash-days",
                        "0",
                        "--storage",
                        "file",
                        "--bucket",
                    ])
                    .arg(dir.0.join("blocks/"))
                    .args([&meta, "bench"]);
                let formatted = run_limited(format, Duration::from_secs(60))
                    .map_err(|e| OpenError::Skip(format!("juicefs format: {e}")))?;
                if !formatted.ok {
                    return Err(OpenError::Skip(format!(
                        "juicefs format exited ({}): {}",
                        formatted.status,
                        last_lines(&formatted.stderr, 2)
                    )));
                }
                let mp = ctx.new_mountpoint(false).map_err(OpenError::Fail)?;
                let mut command = Command::new(&binary);
                command
                    .args(juicefs_mount_args())
                    .arg(dir.0.join("cache"))
                    .arg(&meta)
                    .arg(&mp);
                let log = ctx.log_path("juicefs");
                let guard = spawn_server(command, &mp, &log, false).map_err(OpenError::Skip)?;
                Ok(target(
                    Place::Dir(mp),
                    true,
                    vec![Guard::Dir(dir), Guard::Mount(guard)],
                ))
            }
        }
    }
}

/// passthrough_hp's arguments before SOURCE MOUNTPOINT: in the foreground (our child, so
/// that its CPU time can be read), open to every user (lanefs as root is too: the
/// unprivileged rows need it), libfuse's default thread count and queue depth.
fn passthrough_hp_args(uring: bool, kernel_passthrough: bool) -> Vec<&'static str> {
    let mut args = vec!["--foreground"];
    if uring {
        args.extend(["-o", "allow_other,io_uring"]);
    } else {
        args.extend(["-o", "allow_other", "--clone-fd"]);
    }
    if !kernel_passthrough {
        args.push("--nopassthrough");
    }
    args
}

/// `juicefs mount` arguments before CACHE-DIR META-URL MOUNTPOINT: in the foreground (our
/// child, for its CPU time), its defaults otherwise (as root it mounts with allow_other), but
/// its block cache beside its blocks rather than in /var.
fn juicefs_mount_args() -> [&'static str; 2] {
    ["mount", "--cache-dir"]
}

/// One ring per possible CPU.
fn possible_cpus() -> usize {
    lanefs_fuse::topology::Topology::read().map_or(0, |t| t.possible.len())
}

/// `lanefs mount` arguments for `queues` cloned fds, or io_uring with `uring_depth` entries
/// per ring (skipped when the kernel has it off: the bench never turns it on).
fn transport_args(queues: usize, uring_depth: Option<usize>) -> Result<Vec<String>, OpenError> {
    Ok(match uring_depth {
        Some(depth) => {
            if let Some(why) = lanefs_fuse::uring::KernelSupport::read().obstacle() {
                return Err(OpenError::Skip(why));
            }
            vec![
                "--transport".to_owned(),
                "uring".into(),
                "--queue-depth".into(),
                depth.to_string(),
            ]
        }
        // Explicitly /dev/fuse: `auto` would take io_uring where the kernel has it on.
        None => vec![
            "--queues".to_owned(),
            queues.to_string(),
            "--transport".into(),
            "dev".into(),
        ],
    })
}

#[derive(Debug)]
pub enum OpenError {
    /// Not installed or not built: a note, no rows.
    Skip(String),
    /// It should have worked: its rows are reported as failed with this error.
    Fail(String),
}

/// Where a workload runs: the one file a server offers, or a directory it may fill.
#[derive(Clone, Debug)]
pub enum Place {
    File(PathBuf),
    Dir(PathBuf),
}

pub struct Target {
    pub label: String,
    pub role: Role,
    pub config: Value,
    pub place: Place,
    pub writable: bool,
    /// The process serving the mount, whose CPU time each run reports (None: native, or
    /// several daemons).
    pub server: Option<ServerCpu>,
    /// Further mounts of the same volume by daemons of their own (`place` is on the first).
    pub other_mounts: Vec<PathBuf>,
    /// Dropped last to first: the mount before the directory that backs it.
    guards: Vec<Guard>,
}

impl Drop for Target {
    fn drop(&mut self) {
        while let Some(g) = self.guards.pop() {
            drop(g);
        }
    }
}

/// Held for what its Drop does (and a mount for its server's pid).
enum Guard {
    Dir(#[allow(dead_code)] ScratchDir),
    Mount(MountGuard),
}

/// A directory the bench made; removed with its contents on drop (never across a mount).
pub struct ScratchDir(pub PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !has_mount_under(&self.0) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether anything is mounted at or below `path`.
pub fn has_mount_under(path: &Path) -> bool {
    mounts_under(path).next().is_some()
}

/// Mount points at or below `path`, from /proc/self/mountinfo.
pub fn mounts_under(path: &Path) -> impl Iterator<Item = PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.to_path_buf();
    info.lines()
        .filter_map(mount::parse_mountinfo_line)
        .map(|m| m.mountpoint)
        .filter(move |mp| mp.starts_with(&path))
        .collect::<Vec<_>>()
        .into_iter()
}

pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    mount::unmount(path, true)
}

fn is_mounted(path: &Path) -> bool {
    matches!(mount::find_mount(path), Ok(Some(_)))
}

/// Whether a process is alive (a zombie is not).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

pub enum Server {
    /// Only the mount (the bench's tmpfs).
    None,
    /// A lanefs daemon: not our child (it was re-executed in its own session).
    Daemon(u32),
    /// Our child in its own process group; `term` asks it to stop after the unmount
    /// (qemu-storage-daemon keeps running without its export).
    Child { child: Child, term: bool },
}

/// A mount and the process serving it.
pub struct MountGuard {
    pub mountpoint: PathBuf,
    server: Server,
    registration: u64,
}

impl MountGuard {
    pub fn new(mountpoint: PathBuf, server: Server) -> MountGuard {
        let registration = signals::register(mountpoint.clone(), pid_of(&server));
        MountGuard {
            mountpoint,
            server,
            registration,
        }
    }

    /// The server process, if the mount has one.
    pub fn server_pid(&self) -> Option<u32> {
        pid_of(&self.server)
    }
}

fn pid_of(server: &Server) -> Option<u32> {
    match server {
        Server::None => None,
        Server::Daemon(pid) => Some(*pid),
        Server::Child { child, .. } => Some(child.id()),
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            // Processes that just closed their files may still hold the mount for a moment.
            let clean = (0..5).any(|i| {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(100));
                }
                mount::unmount(&self.mountpoint, false).is_ok()
            });
            if !clean {
                let _ = lazy_unmount(&self.mountpoint);
            }
        }
        match &mut self.server {
            Server::None => {}
            Server::Daemon(pid) => {
                let pid = *pid;
                if !wait_until(Duration::from_secs(10), || !process_alive(pid)) {
                    // SAFETY: sending a signal has no memory effects.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    wait_until(Duration::from_secs(2), || !process_alive(pid));
                }
            }
            Server::Child { child, term } => {
                let pid = child.id() as i32;
                if *term {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
                let exited = wait_until(Duration::from_secs(5), || {
                    matches!(child.try_wait(), Ok(Some(_)) | Err(_))
                });
                if !exited {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        signals::unregister(self.registration);
    }
}

/// `lanefs mount --daemon ARGS SOURCE MP` with this very binary.
/// `lanefs mount --daemon` of `source` on `mp`, with `env` added to its environment (an S3
/// volume's credentials).
fn mount_lanefs(
    ctx: &Ctx,
    args: &[String],
    source: &str,
    mp: &Path,
    env: &[(&str, &str)],
) -> Result<MountGuard, String> {
    let out = Command::new(&ctx.exe)
        .args(["mount", "--daemon"])
        .args(args)
        .args(&ctx.lanefs_args)
        .arg(source)
        .arg(mp)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", ctx.exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let pid = stdout
        .rsplit_once("(daemon pid ")
        .and_then(|(_, rest)| rest.trim_end_matches(')').parse::<u32>().ok());
    match (out.status.success(), pid) {
        (true, Some(pid)) => Ok(MountGuard::new(mp.to_path_buf(), Server::Daemon(pid))),
        (true, None) => {
            // Mounted but unparseable: still make sure it goes away.
            drop(MountGuard::new(mp.to_path_buf(), Server::None));
            Err(format!("unexpected output of lanefs mount: {stdout:?}"))
        }
        (false, _) => Err(String::from_utf8_lossy(&out.stderr)
            .trim()
            .trim_start_matches("lanefs: ")
            .to_owned()),
    }
}

/// `lanefs format VOLUME --data DATA ARGS…` with this very binary, with `env` added to its
/// environment (an S3 volume's credentials).
fn format_volume(
    ctx: &Ctx,
    volume: &Path,
    data: &OsStr,
    args: &[String],
    env: &[(&str, &str)],
) -> Result<(), String> {
    let out = Command::new(&ctx.exe)
        .arg("format")
        .arg(volume)
        .arg("--data")
        .arg(data)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", ctx.exe.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "lanefs format: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Starts a FUSE server in the foreground as our child and waits until `mp` is mounted.
fn spawn_server(
    mut command: Command,
    mp: &Path,
    log: &Path,
    term: bool,
) -> Result<MountGuard, String> {
    let log_file = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", command.get_program()))?;
    let mut guard = MountGuard::new(mp.to_path_buf(), Server::Child { child, term });
    let mut exited = None;
    let mounted = wait_until(Duration::from_secs(15), || {
        if let Server::Child { child, .. } = &mut guard.server
            && let Ok(Some(status)) = child.try_wait()
        {
            exited = Some(status);
            return true;
        }
        matches!(mount::find_mount(mp), Ok(Some(m)) if m.fstype.starts_with("fuse"))
    });
    if let Some(status) = exited {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        return Err(format!(
            "{:?} exited ({status}) before mounting: {}",
            command.get_program(),
            last_lines(&text, 3)
        ));
    }
    if !mounted {
        return Err(format!(
            "{:?} did not mount {} within 15 s",
            command.get_program(),
            mp.display()
        ));
    }
    Ok(guard)
}

/// The last `n` non-empty lines, joined.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// Mounts a tmpfs for the bench (root), returning its guard.
pub fn mount_tmpfs(path: &Path, size_bytes: u64) -> Result<MountGuard, String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let target = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let data = CString::new(format!("size={size_bytes},mode=0755")).expect("no NUL");
    // SAFETY: all pointers are valid NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"lanefs-bench".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    Ok(MountGuard::new(path.to_path_buf(), Server::None))
}

/// "ext4, /tmp": the file system holding `path`.
pub fn fs_of(path: &Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(mount::parse_mountinfo_line)
        .filter(|m| path.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len())
        .map(|m| format!("{}, {}", m.fstype, m.mountpoint.display()))
        .unwrap_or_else(|| "unknown".into())
}
