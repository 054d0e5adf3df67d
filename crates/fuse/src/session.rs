//! A mounted session: mount, answer INIT, open one queue per worker, serve until the
//! connection ends, then tear down.
//!
//! Threads of a session: the queue workers, the control-socket listener, and a signal thread
//! that turns SIGINT/SIGTERM/SIGHUP into a lazy unmount. On the /dev/fuse transport there is
//! one worker per queue, each blocking on its own (cloned) fd. On the io_uring transport there
//! is one worker per possible CPU, pinned to it, serving that CPU's ring, plus one worker
//! reading the session fd, which still carries interrupts, forgets and whatever comes before
//! every ring is registered. Workers share nothing mutable but the file system itself; each
//! owns its buffers, allocated after it is pinned so the memory comes from its own NUMA node.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::abi::{self, init_flags, opcode};
use crate::control::{self, ControlSocket};
use crate::dev::{self, DevSink, PollPolicy, ReadOutcome};
use crate::filesystem::{Connection, Filesystem, InitRequest};
use crate::mount::{self, MountSpec};
use crate::offload::Offload;
use crate::reply::{QueueHandle, Reply};
use crate::request::{self, Operation, WireFormat};
use crate::stats::{self, QueueSnapshot, StatsSnapshot};
use crate::topology::{self, Topology};
use crate::uring::{self, KernelSupport, RingConfig, RingShared, RingSink};
use zerocopy::IntoBytes;

/// The newest protocol minor version we speak.
pub const PROTOCOL_MINOR: u32 = 45;
/// The oldest kernel protocol we accept (Linux 5.10 speaks 7.32).
const MIN_KERNEL_MINOR: u32 = 31;
/// The largest max_write we ask for: the kernel's FUSE_MAX_MAX_PAGES of 256 pages with 4 KiB
/// pages (more with larger pages; 1 MiB is where the seeds' large-I/O gains flatten out).
pub const MAX_MAX_WRITE: u32 = 256 * 4096;
/// Extra read-buffer room beyond max_write: headers, and SETXATTR's 64 KiB value limit.
const BUFFER_SLACK: usize = 64 * 1024 + 8192;
/// How long an idle /dev/fuse worker polls its queue before sleeping, by default: not at all.
/// Measured on 2 vCPUs: polling 50 us lifts 4k psync at 1 job from 65k to 95k IOPS (null), but
/// when the CPUs are oversubscribed (seed 002's seek load: writer + readers + daemon) the
/// poller takes CPU from the callers and seeks drop from 21.8k/s to 0.8k/s with an 8 ms p99.
/// Opt in with `--poll-us` where the daemon has CPUs to spare. io_uring's default differs:
/// see `uring::DEFAULT_RING_POLL`.
pub const DEFAULT_DEV_POLL: Duration = Duration::ZERO;
/// How long a signalled daemon waits for open files to close before aborting the connection.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How requests reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it, cloned /dev/fuse fds otherwise.
    Auto,
    /// io_uring or nothing: mounting fails when the kernel does not offer it.
    Uring,
    /// Cloned /dev/fuse fds.
    Dev,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "uring" | "io_uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            other => Err(format!("transport {other:?}: use auto, uring or dev")),
        }
    }
}

/// How to run a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Which transport serves requests.
    pub transport: Transport,
    /// Entries per io_uring ring (requests a CPU's queue holds at once).
    pub queue_depth: usize,
    /// Worker threads, each with its own /dev/fuse fd (the /dev/fuse transport; io_uring has
    /// one per possible CPU).
    pub queues: usize,
    /// Pin each worker to one CPU, spread across NUMA nodes.
    pub pin: bool,
    /// Largest write the kernel sends in one request (4 KiB..1 MiB).
    pub max_write: u32,
    /// Background requests (async reads, async direct I/O) the kernel keeps in flight.
    pub max_background: u16,
    /// How long an idle worker keeps polling its queue before it sleeps (0: never polls);
    /// None: the transport's default (`DEFAULT_DEV_POLL`, `uring::DEFAULT_RING_POLL`).
    pub poll: Option<Duration>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            transport: Transport::Auto,
            queue_depth: uring::DEFAULT_QUEUE_DEPTH,
            queues: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pin: false,
            max_write: MAX_MAX_WRITE,
            max_background: 128,
            poll: None,
        }
    }
}

/// Names shown in the mount line and in `lanefs stats`.
#[derive(Debug, Clone)]
pub struct Labels {
    /// What is mounted (`null:`, a directory).
    pub source: String,
    /// Which file system serves it (`null`, `passthrough`).
    pub filesystem: String,
}

/// The flags the engine itself implements, whatever the file system.
const ENGINE_FLAGS: u64 = init_flags::ASYNC_READ
    | init_flags::BIG_WRITES
    | init_flags::MAX_PAGES
    | init_flags::PARALLEL_DIROPS
    | init_flags::ASYNC_DIO
    | init_flags::DIRECT_IO_ALLOW_MMAP
    | init_flags::INIT_EXT;

/// The INIT flags the kernel offers (flags2 holds bits 32-63 when INIT_EXT is set).
pub fn offered_flags(kernel: &abi::InitIn) -> u64 {
    let mut offered = kernel.flags as u64;
    if offered & init_flags::INIT_EXT != 0 {
        offered |= (kernel.flags2 as u64) << 32;
    }
    offered
}

/// The kernel's page size: max_pages counts pages, and io_uring payload buffers must hold
/// max_pages of them (4 KiB on x86-64; 16 or 64 KiB on some arm64 kernels).
pub fn page_bytes() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// Settles INIT: the answer to the kernel and the connection the file system will see.
pub fn negotiate(
    kernel: &abi::InitIn,
    fs_want: InitRequest,
    opts: &SessionOptions,
) -> io::Result<(abi::InitOut, Connection)> {
    if kernel.major != 7 || kernel.minor < MIN_KERNEL_MINOR {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the kernel speaks FUSE {}.{}; lanefs needs 7.{MIN_KERNEL_MINOR} or newer",
                kernel.major, kernel.minor
            ),
        ));
    }
    let flags = (ENGINE_FLAGS | fs_want.want) & offered_flags(kernel);
    let max_write = opts.max_write.clamp(4096, MAX_MAX_WRITE);
    let mut out = abi::InitOut {
        major: 7,
        minor: kernel.minor.min(PROTOCOL_MINOR),
        max_readahead: kernel.max_readahead,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        max_background: opts.max_background.max(1),
        congestion_threshold: (opts.max_background.max(1) as u32 * 3 / 4).max(1) as u16,
        max_write,
        time_gran: 1,
        ..Default::default()
    };
    if flags & init_flags::MAX_PAGES != 0 {
        out.max_pages = (max_write as usize).div_ceil(page_bytes()) as u16;
    }
    if flags & init_flags::PASSTHROUGH != 0 {
        out.max_stack_depth = fs_want.max_stack_depth.max(1);
    }
    let conn = Connection {
        minor: out.minor,
        flags,
        max_write,
        session_fd: -1,
        per_cpu_queues: false,
    };
    Ok((out, conn))
}

/// What the mount line says once a session serves.
pub struct Mounted {
    pub line: String,
    pub mountpoint: PathBuf,
}

/// Blocks the shutdown signals in the calling thread (and so in every thread it starts), so
/// that only the session's signal thread receives them.
fn shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Mounts `fs` and serves it until the file system is unmounted (by `umount`, `lanefs
/// umount`, or a signal). `ready` runs once the mount answers requests.
pub fn run<F: Filesystem>(
    fs: Arc<F>,
    spec: &MountSpec,
    opts: &SessionOptions,
    labels: Labels,
    ready: impl FnOnce(&Mounted),
) -> io::Result<()> {
    let signals = shutdown_signals();
    // SAFETY: signals is an initialised set; blocking signals has no memory effects.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    let kernel_uring = KernelSupport::read();
    if opts.transport == Transport::Uring
        && let Some(why) = kernel_uring.obstacle()
    {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("--transport uring: {why}"),
        ));
    }
    // io_uring may be enabled for FUSE yet refused to this process (kernel.io_uring_disabled,
    // a seccomp filter, RLIMIT_MEMLOCK on old kernels): find out before INIT commits to it.
    let uring_offered = opts.transport != Transport::Dev && kernel_uring == KernelSupport::Enabled;
    let ring_refused = uring_offered.then(uring::probe_setup).and_then(Result::err);
    if opts.transport == Transport::Uring
        && let Some(e) = &ring_refused
    {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("--transport uring: {}", uring::setup_refused(e)),
        ));
    }
    let want_uring = uring_offered && ring_refused.is_none();

    let session_fd = Arc::new(mount::mount(spec)?);
    let device = ConnectionDevice::of_new_mount(&spec.mountpoint);
    // From here on, a failure before serving must not leave a dead mount behind.
    let unmount_on_error = |e: io::Error| {
        if let Err(u) = mount::unmount(&spec.mountpoint, true) {
            tracing::warn!("{u}");
        }
        e
    };
    let topology = Topology::read().unwrap_or_else(|e| {
        tracing::warn!("cannot read the CPU topology ({e}); assuming one node");
        Topology::single(std::thread::available_parallelism().map_or(1, |n| n.get()))
    });
    // The pools for slow requests, one per NUMA node; threads start on first use.
    let offload = Arc::new(Offload::new(&topology));
    // INIT is answered on the session fd before the transport's queues exist.
    let init_queue = Arc::new(QueueHandle {
        sink: Box::new(DevSink {
            fd: session_fd.clone(),
        }),
        stats: stats::QueueStats::new(0, None, None),
        offload: offload.clone(),
    });
    let mut conn =
        answer_init(&*fs, &session_fd, &init_queue, opts, want_uring).map_err(unmount_on_error)?;
    let wire = WireFormat {
        setxattr_ext: conn.flags & init_flags::SETXATTR_EXT != 0,
    };
    let over_uring = conn.flags & init_flags::OVER_IO_URING != 0;
    conn.per_cpu_queues = over_uring;
    // Why /dev/fuse serves although io_uring was not refused: said in the mount line.
    let dev_note = match opts.transport {
        Transport::Dev => None,
        _ if over_uring => None,
        Transport::Uring => {
            return Err(unmount_on_error(io::Error::new(
                io::ErrorKind::Unsupported,
                "--transport uring: the kernel did not offer FUSE_OVER_IO_URING in INIT",
            )));
        }
        Transport::Auto => Some(
            kernel_uring
                .obstacle()
                .or_else(|| ring_refused.as_ref().map(uring::setup_refused))
                .unwrap_or_else(|| "the kernel did not offer io_uring in INIT".into()),
        ),
    };
    fs.connected(&conn);

    let mut workers = Vec::new();
    let mut handles: Vec<Arc<QueueHandle>> = Vec::new();
    let mut kinds: Vec<&'static str> = Vec::new();
    let (transport_label, line_detail) = if over_uring {
        // One ring per possible CPU: the kernel uses the rings only once every CPU's queue has
        // an entry, and queues a request on the ring of the CPU its caller runs on.
        let depth = opts.queue_depth.clamp(1, uring::MAX_QUEUE_DEPTH);
        let payload_bytes = uring::payload_bytes(&conn);
        for (id, &cpu) in topology.possible.iter().enumerate() {
            let shared = RingShared::new().map_err(unmount_on_error)?;
            let handle = Arc::new(QueueHandle {
                sink: Box::new(RingSink(shared.clone())),
                stats: stats::QueueStats::new(id, Some(cpu), topology.node_of(cpu)),
                offload: offload.clone(),
            });
            let online = topology.online.contains(&cpu);
            let config = RingConfig {
                qid: cpu as u16,
                depth,
                payload_bytes,
                poll: opts.poll.unwrap_or(uring::DEFAULT_RING_POLL),
                online,
                mountpoint: spec.mountpoint.clone(),
                device: device.map(|d| (d.major, d.minor)),
            };
            let (fs, fd, queue) = (fs.clone(), session_fd.clone(), handle.clone());
            let mountpoint = spec.mountpoint.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("lanefs-ring{cpu}"))
                    .spawn(move || {
                        if let Err(e) = topology::pin_current_thread(cpu) {
                            // An offline CPU: its ring is still needed (the kernel waits for
                            // every possible CPU's queue), with one entry until the CPU comes
                            // online; it pins itself then.
                            if online {
                                tracing::warn!("pinning ring {cpu}'s worker failed: {e}");
                            }
                        }
                        if let Err(e) = uring::serve_ring(&*fs, wire, &fd, &shared, &queue, &config)
                        {
                            // The kernel keeps queueing this CPU's requests on the ring, and
                            // nobody would answer them: end the connection rather than let
                            // callers on this CPU hang.
                            tracing::error!(
                                cpu,
                                "ring stopped: {e}; ending the connection (callers get \
                                 ECONNABORTED instead of waiting forever)"
                            );
                            end_connection(&mountpoint, device);
                        }
                    })?,
            );
            handles.push(handle);
            kinds.push("io_uring");
        }
        // The session fd keeps a reader: interrupts, forgets, and requests sent before every
        // ring is registered come this way.
        let dev_queue = Arc::new(QueueHandle {
            sink: Box::new(DevSink {
                fd: session_fd.clone(),
            }),
            stats: stats::QueueStats::new(handles.len(), None, None),
            offload: offload.clone(),
        });
        workers.push(spawn_dev_worker(
            &fs,
            wire,
            session_fd.clone(),
            dev_queue.clone(),
            Arc::new(PollPolicy {
                window: Duration::ZERO,
                poller: AtomicBool::new(false),
            }),
            conn.max_write as usize + BUFFER_SLACK,
        )?);
        handles.push(dev_queue);
        kinds.push("/dev/fuse");
        (
            "io_uring",
            format!(
                "transport io_uring: {} rings, one per CPU, {depth} entries each; \
                 /dev/fuse for interrupts",
                topology.possible.len()
            ),
        )
    } else {
        let queues = opts.queues.max(1);
        let cpus = opts.pin.then(|| topology.spread(queues));
        let queue_handle = |id: usize, fd: &Arc<OwnedFd>| {
            let cpu = cpus.as_ref().map(|c| c[id]);
            Arc::new(QueueHandle {
                sink: Box::new(DevSink { fd: fd.clone() }),
                stats: stats::QueueStats::new(id, cpu, cpu.and_then(|c| topology.node_of(c))),
                offload: offload.clone(),
            })
        };
        // Queue 0 serves on the session fd; the others on clones, whose replies go back on
        // them.
        let mut queue_fds = vec![session_fd.clone()];
        handles.push(queue_handle(0, &session_fd));
        for id in 1..queues {
            let fd = Arc::new(mount::clone_queue_fd(session_fd.as_raw_fd()).map_err(|e| {
                unmount_on_error(io::Error::new(
                    e.kind(),
                    format!("cloning a /dev/fuse queue failed: {e}"),
                ))
            })?);
            handles.push(queue_handle(id, &fd));
            queue_fds.push(fd);
        }
        let poll = Arc::new(PollPolicy {
            window: opts.poll.unwrap_or(DEFAULT_DEV_POLL),
            poller: AtomicBool::new(false),
        });
        for (fd, handle) in queue_fds.into_iter().zip(handles.iter().cloned()) {
            workers.push(spawn_dev_worker(
                &fs,
                wire,
                fd,
                handle,
                poll.clone(),
                conn.max_write as usize + BUFFER_SLACK,
            )?);
            kinds.push("/dev/fuse");
        }
        let pinned = if opts.pin { ", pinned" } else { "" };
        let note = dev_note.map_or(String::new(), |n| format!("; {n}"));
        (
            "/dev/fuse",
            format!(
                "{} queue{}{pinned}, transport /dev/fuse{note}",
                queues,
                if queues == 1 { "" } else { "s" },
            ),
        )
    };
    let handles = Arc::new(handles);

    let control = start_control(
        &spec.mountpoint,
        &fs,
        &handles,
        &kinds,
        transport_label,
        &labels,
        &conn,
    );
    let finished = Arc::new(AtomicBool::new(false));
    let signal_thread = {
        let finished = finished.clone();
        let mountpoint = spec.mountpoint.clone();
        std::thread::Builder::new()
            .name("lanefs-signals".into())
            .spawn(move || wait_for_shutdown(signals, &mountpoint, device, &finished))?
    };

    ready(&Mounted {
        line: format!(
            "mounted {} on {} ({line_detail})",
            labels.source,
            spec.mountpoint.display(),
        ),
        mountpoint: spec.mountpoint.clone(),
    });

    for worker in workers {
        if worker.join().is_err() {
            tracing::error!("a queue worker panicked outside a request");
        }
    }
    finished.store(true, Ordering::Release);
    fs.destroy();
    let _ = signal_thread.join();
    // Last: `lanefs umount` waits for the socket to go to know the daemon is done.
    drop(control);
    tracing::info!("{} unmounted; exiting", spec.mountpoint.display());
    Ok(())
}

/// Starts a worker serving one /dev/fuse fd, pinned first if its queue has a CPU.
fn spawn_dev_worker<F: Filesystem>(
    fs: &Arc<F>,
    wire: WireFormat,
    fd: Arc<OwnedFd>,
    handle: Arc<QueueHandle>,
    poll: Arc<PollPolicy>,
    buffer_size: usize,
) -> io::Result<std::thread::JoinHandle<()>> {
    let fs = fs.clone();
    std::thread::Builder::new()
        .name(format!("lanefs-q{}", handle.stats.id))
        .spawn(move || {
            if let Some(cpu) = handle.stats.cpu
                && let Err(e) = topology::pin_current_thread(cpu)
            {
                tracing::warn!(queue = handle.stats.id, "pinning to CPU {cpu} failed: {e}");
            }
            // Allocated and first touched here, after pinning: node-local memory. Words, so
            // that the argument structs in it are aligned for zero-copy decoding.
            let mut words = vec![0u64; buffer_size.div_ceil(8)];
            let buf = words.as_mut_bytes();
            if let Err(e) = dev::serve_queue(&*fs, wire, &fd, &handle, buf, &poll) {
                tracing::error!(queue = handle.stats.id, "queue stopped: {e}");
            }
        })
}

/// Reads INIT from the session fd, negotiates and answers it. `want_uring` asks the kernel
/// for FUSE_OVER_IO_URING (granted only if it offers it).
fn answer_init<F: Filesystem>(
    fs: &F,
    session_fd: &OwnedFd,
    queue: &Arc<QueueHandle>,
    opts: &SessionOptions,
    want_uring: bool,
) -> io::Result<Connection> {
    let mut words = vec![0u64; (opts.max_write as usize + BUFFER_SLACK).div_ceil(8)];
    let buf = words.as_mut_bytes();
    let n = loop {
        match dev::read_request(session_fd, buf)? {
            ReadOutcome::Request(n) => break n,
            ReadOutcome::Retry | ReadOutcome::Empty => continue,
            ReadOutcome::Ended => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the kernel closed the connection before INIT",
                ));
            }
        }
    };
    let started = Instant::now();
    let (header, body) = request::split_header(&buf[..n])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad INIT: {e}")))?;
    let reply = Reply::new(header.unique, 0, header.opcode, started, queue.clone());
    let kernel = match request::decode(header.opcode, body, WireFormat::default()) {
        Ok(Operation::Init { arg }) => arg,
        other => {
            reply.error(libc::EPROTO);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "expected INIT from the kernel, got {} ({:?})",
                    opcode::name(header.opcode),
                    other.err()
                ),
            ));
        }
    };
    let mut want = fs.init(offered_flags(&kernel));
    if want_uring {
        want.want |= init_flags::OVER_IO_URING;
    }
    let (out, mut conn) = match negotiate(&kernel, want, opts) {
        Ok(settled) => settled,
        Err(e) => {
            reply.error(libc::EPROTO);
            return Err(e);
        }
    };
    conn.session_fd = session_fd.as_raw_fd();
    tracing::debug!(
        kernel = format!("7.{}", kernel.minor),
        flags = init_flags::describe(conn.flags),
        "INIT"
    );
    reply.init(&out);
    Ok(conn)
}

fn start_control<F: Filesystem>(
    mountpoint: &Path,
    fs: &Arc<F>,
    queues: &Arc<Vec<Arc<QueueHandle>>>,
    kinds: &[&'static str],
    transport: &'static str,
    labels: &Labels,
    conn: &Connection,
) -> Option<ControlSocket> {
    let info = match mount::find_mount(mountpoint) {
        Ok(Some(info)) => info,
        other => {
            tracing::warn!("cannot find our mount in mountinfo ({other:?}); no `lanefs stats`");
            return None;
        }
    };
    let path = control::socket_path(&info);
    let (fs, queues, labels, conn) = (fs.clone(), queues.clone(), labels.clone(), *conn);
    let kinds = kinds.to_vec();
    let mountpoint = mountpoint.display().to_string();
    let snapshot = move || StatsSnapshot {
        source: labels.source.clone(),
        mountpoint: mountpoint.clone(),
        filesystem: labels.filesystem.clone(),
        transport: transport.into(),
        protocol: format!("7.{}", conn.minor),
        flags: init_flags::describe(conn.flags),
        max_write: conn.max_write,
        queues: queues
            .iter()
            .zip(&kinds)
            .map(|(q, kind)| QueueSnapshot {
                id: q.stats.id,
                transport: (*kind).into(),
                cpu: q.stats.cpu,
                node: q.stats.node,
                requests: q.stats.requests(),
            })
            .collect(),
        ops: stats::merge_ops(&queues.iter().map(|q| &q.stats).collect::<Vec<_>>()),
        counters: fs.counters(),
    };
    match ControlSocket::start(&path, snapshot) {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!("control socket {} unavailable: {e}", path.display());
            None
        }
    }
}

/// Our FUSE connection's device number, as mountinfo and fusectl name it. The engine's
/// shutdown unmounts and aborts this connection, never whatever a path leads to: a mount
/// stacked on ours (on its mount point or inside it) is not ours to detach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConnectionDevice {
    major: u32,
    minor: u32,
}

impl ConnectionDevice {
    /// Our mount, found right after mounting (nothing can be stacked on it yet).
    fn of_new_mount(mountpoint: &Path) -> Option<ConnectionDevice> {
        match mount::find_mount(mountpoint) {
            Ok(Some(info)) => Some(ConnectionDevice {
                major: info.major,
                minor: info.minor,
            }),
            other => {
                tracing::warn!(
                    "cannot find our mount in mountinfo ({other:?}); shutdown will unmount \
                     {} by path",
                    mountpoint.display()
                );
                None
            }
        }
    }
}

/// What `unmount_ours` found and did.
#[derive(Debug, PartialEq)]
enum Detached {
    /// Our mount(s) were unmounted lazily.
    Unmounted,
    /// Our connection is mounted nowhere any more.
    Gone,
    /// Another mount sits on or inside ours (here): unmounting ours would detach it too, so
    /// ours stays; only aborting the connection ends it.
    Covered(PathBuf),
}

/// Unmounts our mount: first, when the mount at the top of the mount point is ours, a plain
/// unmount (it succeeds when nothing is open on it and nothing is mounted inside it, and then
/// no mountinfo is read); if that fails (EBUSY), every mount of our connection is unmounted
/// lazily, unless another mount sits on or inside one of them, decided from one reading of
/// mountinfo. Each unmount is by path (UMOUNT_NOFOLLOW: a symlink there is not followed) and
/// takes whatever mount is at the top of that path: one stacked there between our check and
/// the unmount (by root, or by a user through fusermount3 on a directory of ours they own)
/// would be detached instead of ours, and ours would stay, served until the connection is
/// aborted. A window of microseconds.
fn unmount_ours(device: Option<ConnectionDevice>, mountpoint: &Path) -> Detached {
    let Some(device) = device else {
        if let Err(e) = mount::unmount(mountpoint, true) {
            tracing::warn!("{e}");
        }
        return Detached::Unmounted;
    };
    if top_mount_is(mountpoint, device) && unmount_plain(mountpoint).is_ok() {
        return Detached::Unmounted;
    }
    let mounts = match mount::mounts() {
        Ok(mounts) => mounts,
        Err(e) => {
            tracing::warn!("cannot read mountinfo ({e}); not unmounting");
            return Detached::Gone;
        }
    };
    match covering(&mounts, device) {
        Err(()) => Detached::Gone,
        Ok(Some(above)) => Detached::Covered(above),
        Ok(None) => {
            for ours in mounts
                .iter()
                .filter(|m| (m.major, m.minor) == (device.major, device.minor))
            {
                if let Err(e) = mount::unmount(&ours.mountpoint, true) {
                    tracing::warn!("{e}");
                }
            }
            Detached::Unmounted
        }
    }
}

/// Whether the mount at the top of `path` is of our connection: a statx that does not
/// follow a symlink, trigger an automount or sync (no request reaches any file system).
fn top_mount_is(path: &Path, device: ConnectionDevice) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statx is plain old data, zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated, stx is writable.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_DONT_SYNC,
            0,
            &mut stx,
        )
    };
    rc == 0 && (stx.stx_dev_major, stx.stx_dev_minor) == (device.major, device.minor)
}

/// One plain umount2 of `path` with UMOUNT_NOFOLLOW (EBUSY when anything is open on the
/// mount or mounted inside it: no waiting, no lazy detach).
fn unmount_plain(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: path is NUL-terminated.
    if unsafe { libc::umount2(path.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Where another mount sits on or inside a mount of ours (Ok(None): nowhere); Err when our
/// connection is not mounted at all.
fn covering(mounts: &[mount::MountInfo], device: ConnectionDevice) -> Result<Option<PathBuf>, ()> {
    let ours: Vec<u32> = mounts
        .iter()
        .filter(|m| (m.major, m.minor) == (device.major, device.minor))
        .map(|m| m.id)
        .collect();
    if ours.is_empty() {
        return Err(());
    }
    Ok(mounts
        .iter()
        .find(|m| mount::sits_on(m, &ours))
        .map(|m| m.mountpoint.clone()))
}

/// The signal thread: a shutdown signal unmounts our mount lazily, so the queues see the
/// connection end once the last open file closes; if files stay open past the grace period,
/// the connection is aborted through fusectl so the daemon still exits. If another mount is
/// stacked on ours, ours is not unmounted (that would detach the other): the connection is
/// aborted at once, and our mount stays, dead, under it.
fn wait_for_shutdown(
    signals: libc::sigset_t,
    mountpoint: &Path,
    device: Option<ConnectionDevice>,
    finished: &AtomicBool,
) {
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    let mut signalled_at: Option<Instant> = None;
    while !finished.load(Ordering::Acquire) {
        // SAFETY: signals is initialised and blocked in this thread; info is writable.
        let sig = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigtimedwait(&signals, &mut info, &tick)
        };
        if sig > 0 && signalled_at.is_none() {
            tracing::info!("signal {sig}: unmounting {}", mountpoint.display());
            signalled_at = Some(Instant::now());
            match unmount_ours(device, mountpoint) {
                Detached::Covered(above) => {
                    tracing::warn!(
                        "another mount sits on ours at {}: leaving both mounted and aborting \
                         our connection (our mount stays, dead, until unmounted)",
                        above.display()
                    );
                    if let Some(device) = device {
                        abort_connection(device.minor);
                    }
                }
                Detached::Unmounted | Detached::Gone => {
                    let Some(device) = device else { continue };
                    let finished_wait = Instant::now();
                    while !finished.load(Ordering::Acquire)
                        && finished_wait.elapsed() < SHUTDOWN_GRACE
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    if !finished.load(Ordering::Acquire) {
                        tracing::warn!(
                            "files still open after {SHUTDOWN_GRACE:?}; aborting the connection"
                        );
                        abort_connection(device.minor);
                    }
                }
            }
        }
    }
}

/// Ends a connection the daemon can no longer serve: unmounts our mount lazily (new callers
/// get ENOTCONN; not if a mount is stacked on it) and aborts the connection, so that
/// requests already queued fail instead of waiting for an answer that will not come.
fn end_connection(mountpoint: &Path, device: Option<ConnectionDevice>) {
    if let Detached::Covered(above) = unmount_ours(device, mountpoint) {
        tracing::warn!(
            "another mount sits on ours at {}: aborting our connection without unmounting",
            above.display()
        );
    }
    if let Some(device) = device {
        abort_connection(device.minor);
    }
}

/// Aborts a FUSE connection through fusectl (/sys/fs/fuse/connections/N/abort), mounting
/// fusectl first if nobody has.
fn abort_connection(device_minor: u32) {
    const FUSECTL: &str = "/sys/fs/fuse/connections";
    let abort = format!("{FUSECTL}/{device_minor}/abort");
    if !Path::new(&abort).exists() {
        let target = std::ffi::CString::new(FUSECTL).expect("no NUL");
        // SAFETY: all pointers are valid NUL-terminated strings; data may be null.
        let rc = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                target.as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            tracing::warn!(
                "mounting fusectl on {FUSECTL}: {}",
                io::Error::last_os_error()
            );
        }
    }
    if let Err(e) = std::fs::write(&abort, "1") {
        tracing::error!("cannot abort the connection via {abort}: {e}; exiting anyway");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(minor: u32, flags: u64) -> abi::InitIn {
        abi::InitIn {
            major: 7,
            minor,
            max_readahead: 131072,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            ..Default::default()
        }
    }

    #[test]
    fn negotiate_intersects_with_what_the_kernel_offers() {
        let offered = ENGINE_FLAGS | init_flags::PASSTHROUGH | init_flags::POSIX_LOCKS;
        let want = InitRequest {
            want: init_flags::PASSTHROUGH | init_flags::WRITEBACK_CACHE,
            max_stack_depth: 1,
        };
        let (out, conn) =
            negotiate(&kernel(45, offered), want, &SessionOptions::default()).unwrap();
        assert_eq!(out.minor, 45);
        assert_ne!(conn.flags & init_flags::PASSTHROUGH, 0);
        // Asked for, not offered.
        assert_eq!(conn.flags & init_flags::WRITEBACK_CACHE, 0);
        // Offered, not asked for.
        assert_eq!(conn.flags & init_flags::POSIX_LOCKS, 0);
        assert_eq!(out.flags2, (conn.flags >> 32) as u32);
        assert_eq!(out.max_stack_depth, 1);
        assert_eq!(out.max_write, MAX_MAX_WRITE);
        assert_eq!(out.max_pages, 256);
    }

    #[test]
    fn negotiate_speaks_the_older_minor_and_clamps_max_write() {
        let opts = SessionOptions {
            max_write: 10,
            ..Default::default()
        };
        let (out, conn) =
            negotiate(&kernel(38, ENGINE_FLAGS), InitRequest::default(), &opts).unwrap();
        assert_eq!(out.minor, 38);
        assert_eq!(conn.max_write, 4096);
        assert_eq!(out.max_pages, 1);
        assert_eq!(out.max_stack_depth, 0);
    }

    #[test]
    fn negotiate_without_init_ext_ignores_flags2() {
        let mut k = kernel(45, init_flags::ASYNC_READ);
        k.flags2 = u32::MAX;
        let (out, conn) =
            negotiate(&k, InitRequest::default(), &SessionOptions::default()).unwrap();
        assert_eq!(conn.flags, init_flags::ASYNC_READ);
        assert_eq!(out.flags2, 0);
    }

    #[test]
    fn a_mount_on_or_inside_ours_covers_it() {
        let line = |id: u32, parent: u32, dev: &str, at: &str| {
            mount::parse_mountinfo_line(&format!(
                "{id} {parent} {dev} / {at} rw - fuse.lanefs null: rw"
            ))
            .unwrap()
        };
        let ours = ConnectionDevice {
            major: 0,
            minor: 52,
        };
        let alone = [line(1, 0, "8:1", "/"), line(40, 1, "0:52", "/mnt")];
        assert_eq!(covering(&alone, ours), Ok(None));
        // Stacked on our mount point, or mounted inside ours: both sit on our mount.
        let stacked = [
            alone[0].clone(),
            alone[1].clone(),
            line(41, 40, "0:60", "/mnt"),
        ];
        assert_eq!(covering(&stacked, ours), Ok(Some(PathBuf::from("/mnt"))));
        let inside = [
            alone[0].clone(),
            alone[1].clone(),
            line(41, 40, "0:60", "/mnt/d"),
        ];
        assert_eq!(covering(&inside, ours), Ok(Some(PathBuf::from("/mnt/d"))));
        // Ours under someone else's: not covered. Gone: Err.
        let under = [
            alone[0].clone(),
            line(39, 1, "0:60", "/mnt"),
            line(40, 39, "0:52", "/mnt"),
        ];
        assert_eq!(covering(&under, ours), Ok(None));
        assert_eq!(covering(&alone[..1], ours), Err(()));
    }

    #[test]
    fn negotiate_refuses_old_kernels() {
        let err = negotiate(
            &kernel(26, 0),
            InitRequest::default(),
            &SessionOptions::default(),
        );
        assert!(err.unwrap_err().to_string().contains("7.26"));
    }
}
