//! CPUs and NUMA nodes, read from /sys, and pinning a thread to a CPU.
//!
//! Parsing takes the sysfs root as an argument so that recorded layouts of multi-node machines
//! can be tested on this one-node machine.

use std::io;
use std::path::Path;

/// Parses a kernel CPU list such as "0-3,8,10-11".
pub fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The machine's CPUs grouped by NUMA node.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Online CPUs, ascending.
    pub online: Vec<usize>,
    /// Possible CPUs (io_uring wants one queue per possible CPU).
    pub possible: Vec<usize>,
    /// `nodes[i]` = (node id, its online CPUs). One node 0 with every CPU when /sys has no
    /// node directory (kernels without NUMA).
    pub nodes: Vec<(usize, Vec<usize>)>,
}

impl Topology {
    /// Reads the topology under `sys` (normally "/sys").
    pub fn read_from(sys: &Path) -> io::Result<Topology> {
        let read_list = |rel: &str| -> io::Result<Vec<usize>> {
            let text = std::fs::read_to_string(sys.join(rel))?;
            parse_cpu_list(&text).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "cannot parse CPU list {text:?} in {}",
                        sys.join(rel).display()
                    ),
                )
            })
        };
        let online = read_list("devices/system/cpu/online")?;
        let possible = read_list("devices/system/cpu/possible").unwrap_or_else(|_| online.clone());
        let mut nodes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(sys.join("devices/system/node")) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("node"))
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                let rel = format!("devices/system/node/node{id}/cpulist");
                let cpus: Vec<usize> = read_list(&rel)?
                    .into_iter()
                    .filter(|c| online.contains(c))
                    .collect();
                if !cpus.is_empty() {
                    nodes.push((id, cpus));
                }
            }
        }
        nodes.sort();
        if nodes.is_empty() {
            nodes.push((0, online.clone()));
        }
        Ok(Topology {
            online,
            possible,
            nodes,
        })
    }

    /// A machine of `cpus` CPUs on one node: the fallback when /sys cannot be read.
    pub fn single(cpus: usize) -> Topology {
        let online: Vec<usize> = (0..cpus.max(1)).collect();
        Topology {
            possible: online.clone(),
            nodes: vec![(0, online.clone())],
            online,
        }
    }

    pub fn read() -> io::Result<Topology> {
        Self::read_from(Path::new("/sys"))
    }

    /// The node a CPU belongs to.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.nodes
            .iter()
            .find(|(_, cpus)| cpus.contains(&cpu))
            .map(|(id, _)| *id)
    }

    /// CPUs for `count` workers, spread round-robin across nodes so that every node serves
    /// queues and each worker's buffers are local to the node it runs on.
    pub fn spread(&self, count: usize) -> Vec<usize> {
        let mut cursors = vec![0usize; self.nodes.len()];
        (0..count)
            .map(|i| {
                let n = i % self.nodes.len();
                let cpus = &self.nodes[n].1;
                let cpu = cpus[cursors[n] % cpus.len()];
                cursors[n] += 1;
                cpu
            })
            .collect()
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= CPU_SET_CAPACITY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "CPU number out of range",
        ));
    }
    pin_current_thread_to(&[cpu])
}

/// CPU numbers a cpu_set_t can hold.
const CPU_SET_CAPACITY: usize = 8 * std::mem::size_of::<libc::cpu_set_t>();

/// Keeps the calling thread on a set of CPUs (a NUMA node's).
pub fn pin_current_thread_to(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu < CPU_SET_CAPACITY {
            // SAFETY: cpu is within the set's capacity (checked above).
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
    }
    // SAFETY: pid 0 is the calling thread; set is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    (cpu >= 0).then_some(cpu as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sys(online: &str, nodes: &[(usize, &str)]) -> tempdir::TempSys {
        fake_sys_with_possible(online, online, nodes)
    }

    /// A recorded /sys layout under a temp dir: the CPU lists and each node's cpulist.
    fn fake_sys_with_possible(
        online: &str,
        possible: &str,
        nodes: &[(usize, &str)],
    ) -> tempdir::TempSys {
        let root = tempdir::TempSys::new();
        let cpu = root.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), online).unwrap();
        std::fs::write(cpu.join("possible"), possible).unwrap();
        for (id, list) in nodes {
            let dir = root.path().join(format!("devices/system/node/node{id}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), list).unwrap();
        }
        root
    }

    mod tempdir {
        pub struct TempSys(std::path::PathBuf);
        impl TempSys {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "lanefs-topo-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                TempSys(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for TempSys {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn two_node_machine_spreads_across_nodes() {
        // A recorded layout: 2 nodes, 8 CPUs each, interleaved numbering as on many Xeons.
        let sys = fake_sys("0-15", &[(0, "0-3,8-11"), (1, "4-7,12-15")]);
        let topo = Topology::read_from(sys.path()).unwrap();
        assert_eq!(topo.nodes.len(), 2);
        assert_eq!(topo.node_of(9), Some(0));
        assert_eq!(topo.node_of(12), Some(1));
        assert_eq!(topo.spread(4), vec![0, 4, 1, 5]);
    }

    #[test]
    fn four_node_machine_with_a_cpuless_node() {
        let sys = fake_sys("0-11", &[(0, "0-3"), (1, "4-7"), (2, ""), (3, "8-11")]);
        let topo = Topology::read_from(sys.path()).unwrap();
        let ids: Vec<usize> = topo.nodes.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![0, 1, 3], "memory-only node 2 serves no queue");
        assert_eq!(topo.spread(6), vec![0, 4, 8, 1, 5, 9]);
        assert_eq!(topo.node_of(10), Some(3));
    }

    #[test]
    fn rings_cover_possible_cpus_not_just_online_ones() {
        // A 2-socket machine with hot-pluggable CPUs: 16 online, 32 possible (as firmware that
        // reserves sockets reports). io_uring needs a ring for each of the 32.
        let sys = fake_sys_with_possible("0-15\n", "0-31\n", &[(0, "0-7\n"), (1, "8-15\n")]);
        let topo = Topology::read_from(sys.path()).unwrap();
        assert_eq!(topo.possible.len(), 32);
        assert_eq!(topo.online.len(), 16);
        assert_eq!(topo.node_of(3), Some(0));
        assert_eq!(topo.node_of(12), Some(1));
        // An offline CPU has no node to serve from; its ring runs unpinned.
        assert_eq!(topo.node_of(20), None);
        assert_eq!(topo.spread(4), vec![0, 8, 1, 9]);
    }

    #[test]
    fn four_node_machine_interleaved_like_an_epyc() {
        // 4 nodes of 4 CPUs each, numbered across nodes (node n has n, n+4, n+8, n+12).
        let sys = fake_sys(
            "0-15",
            &[
                (0, "0,4,8,12"),
                (1, "1,5,9,13"),
                (2, "2,6,10,14"),
                (3, "3,7,11,15"),
            ],
        );
        let topo = Topology::read_from(sys.path()).unwrap();
        assert_eq!(topo.nodes.len(), 4);
        assert_eq!(topo.node_of(14), Some(2));
        assert_eq!(topo.spread(8), vec![0, 1, 2, 3, 4, 5, 6, 7]);
        for cpu in topo.possible.iter().copied() {
            assert_eq!(topo.node_of(cpu), Some(cpu % 4));
        }
    }

    #[test]
    fn no_node_directory_means_one_node() {
        let sys = fake_sys("0-1", &[]);
        let topo = Topology::read_from(sys.path()).unwrap();
        assert_eq!(topo.nodes, vec![(0, vec![0, 1])]);
        assert_eq!(topo.spread(3), vec![0, 1, 0]);
    }

    #[test]
    fn this_machine_reads() {
        let topo = Topology::read().unwrap();
        assert!(!topo.online.is_empty());
        assert!(topo.node_of(topo.online[0]).is_some());
    }
}
