//! `lanefs stats MOUNTPOINT`: a mount's statistics, read from its control socket.

use std::io;
use std::path::Path;

use lanefs_fuse::control;
use lanefs_fuse::mount;
use lanefs_fuse::stats::StatsSnapshot;

pub fn run(mountpoint: &Path, json: bool) -> io::Result<()> {
    let mountpoint = mount::absolute(mountpoint)?;
    let info = match mount::find_mount(&mountpoint)? {
        Some(info) if info.fstype == mount::FSTYPE => info,
        Some(info) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a {} mount, not lanefs",
                    mountpoint.display(),
                    info.fstype
                ),
            ));
        }
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a mount point", mountpoint.display()),
            ));
        }
    };
    let snapshot = control::query(&info)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&snapshot).map_err(io::Error::other)?
        );
    } else {
        print!("{}", render(&snapshot));
    }
    Ok(())
}

fn render(s: &StatsSnapshot) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} ({}, transport {}, FUSE {}, max_write {})",
        s.source, s.mountpoint, s.filesystem, s.transport, s.protocol, s.max_write
    );
    let _ = writeln!(out, "flags: {}", s.flags);
    let _ = writeln!(out, "\nqueue  transport  requests  cpu  node");
    for q in &s.queues {
        let show = |v: Option<usize>| v.map_or("-".to_string(), |v| v.to_string());
        let _ = writeln!(
            out,
            "{:>5}  {:<9}  {:>8}  {:>3}  {:>4}",
            q.id,
            q.transport,
            q.requests,
            show(q.cpu),
            show(q.node)
        );
    }
    let _ = writeln!(
        out,
        "\n{:<16} {:>10} {:>8} {:>10} {:>10} {:>10}",
        "op", "count", "errors", "p50 us", "p99 us", "max us"
    );
    for op in &s.ops {
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            op.op, op.count, op.errors, op.p50_us, op.p99_us, op.max_us
        );
    }
    if !s.counters.is_empty() {
        let _ = writeln!(out, "\ncounters:");
        for (name, value) in &s.counters {
            let _ = writeln!(out, "  {name:<32} {value}");
        }
    }
    out
}
