//! A server's CPU time, read from /proc around each measured run, so that the report can put
//! operations per server CPU-second next to throughput: utime + stime of the server process
//! (all its threads, io_uring's kernel workers included), of the children it waited for
//! (cutime + cstime) and of its descendants still running.

use std::collections::HashMap;

/// The process serving a mount: the lanefs daemon, or an anchor the bench spawned.
#[derive(Clone, Copy, Debug)]
pub struct ServerCpu {
    pub pid: u32,
}

impl ServerCpu {
    /// CPU seconds the server and its descendants have used so far; None when it is gone.
    pub fn seconds(self) -> Option<f64> {
        let ticks = tree_ticks(self.pid, &all_stats())?;
        Some(ticks as f64 / ticks_per_second())
    }
}

/// One process' line of /proc/PID/stat, the fields the bench uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    /// utime + stime + cutime + cstime, in clock ticks.
    ticks: u64,
}

/// Parses /proc/PID/stat: the fields after the command name, which is in parentheses and may
/// itself contain spaces and parentheses (so the last ')' ends it).
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 of proc_pid_stat(5) (state): field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = field(14)? + field(15)? + field(16)? + field(17)?;
    Some(Stat {
        ppid: u32::try_from(field(4)?).ok()?,
        ticks,
    })
}

/// Every process' stat, by pid (threads are counted in their process' line).
fn all_stats() -> HashMap<u32, Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parse_stat(&text)?))
        })
        .collect()
}

/// Ticks of `pid` and of every live descendant; None when `pid` is not there.
fn tree_ticks(pid: u32, stats: &HashMap<u32, Stat>) -> Option<u64> {
    let mut total = stats.get(&pid)?.ticks;
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for (child, stat) in stats {
            if stat.ppid == parent && *child != pid {
                total += stat.ticks;
                parents.push(*child);
            }
        }
    }
    Some(total)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The smallest CPU time a reading can show: one clock tick.
pub fn resolution_s() -> f64 {
    1.0 / ticks_per_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines() {
        // A command name with a space and a parenthesis; utime 700, stime 300, cutime 20,
        // cstime 5.
        let line = "4242 (lanefs (x) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 700 300 20 5 20 \
                    0 6 0 12345 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                ppid: 1,
                ticks: 1025
            })
        );
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn sums_the_live_descendants_only() {
        let stats: HashMap<u32, Stat> = [
            (10, Stat { ppid: 1, ticks: 5 }),
            (11, Stat { ppid: 10, ticks: 7 }),
            (12, Stat { ppid: 11, ticks: 1 }),
            (
                13,
                Stat {
                    ppid: 1,
                    ticks: 100,
                },
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(tree_ticks(10, &stats), Some(13));
        assert_eq!(tree_ticks(11, &stats), Some(8));
        assert_eq!(tree_ticks(99, &stats), None);
    }

    #[test]
    fn this_process_uses_cpu() {
        let me = ServerCpu {
            pid: std::process::id(),
        };
        let before = me.seconds().unwrap();
        // Spin until the reading moves (a busy machine may deschedule us for a while).
        let start = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after - before < resolution_s() && start.elapsed().as_secs() < 10 {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
            after = me.seconds().unwrap();
        }
        assert!(after - before >= resolution_s(), "{before} -> {after}");
    }
}
