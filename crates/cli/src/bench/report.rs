//! The Markdown report: machine and settings, then per suite its aims, one table per chart
//! family (median, min, max, ratios), its charts, what was skipped and why.

use std::fmt::Write;

use crate::bench::chart;
use crate::bench::model::{BenchResults, CpuSummary, Row, Status, Unit};

/// 1234567 -> "1.23M", 45678 -> "45.7k"; seconds and µs with enough digits.
pub fn fmt_value(v: f64, unit: Unit) -> String {
    if unit == Unit::SECONDS {
        return if v < 10.0 {
            format!("{v:.3}")
        } else {
            format!("{v:.1}")
        };
    }
    if unit == Unit::MICROS {
        return if v < 10.0 {
            format!("{v:.2}")
        } else {
            format!("{v:.1}")
        };
    }
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if unit == Unit::MIBS && a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "".into(), |r| format!("{r:.2}x"))
}

/// The server CPU cells: CPU seconds per run and operations per CPU-second (blank where no
/// server was measured).
fn cpu_cells(cpu: Option<CpuSummary>) -> (String, String) {
    match cpu {
        None => (String::new(), String::new()),
        Some(c) => (
            format!("{:.3}", c.cpu_s),
            c.ops_per_cpu_s
                .map_or_else(|| "< 1 tick".into(), |rate| fmt_value(rate, Unit::IOPS)),
        ),
    }
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

pub fn markdown(results: &BenchResults) -> String {
    let mut s = String::new();
    let m = &results.machine;
    let rev = &results.lanefs;
    let _ = writeln!(s, "# lanefs bench\n");
    let _ = writeln!(
        s,
        "Run {} to {} on **{}**: Linux {}, {} ({} cores), {:.1} GiB memory, load at start {}; \
         open-file limit {}.\n",
        results.started,
        results.finished,
        m.hostname,
        m.kernel,
        m.cpu_model,
        m.cores,
        m.memory_bytes as f64 / (1u64 << 30) as f64,
        m.loadavg_at_start,
        m.open_file_limit
    );
    let _ = writeln!(
        s,
        "lanefs {} revision `{}`{}. Settings: {} s per run, {} repetition{}, {} s warm-up{}. \
         Command: `{}`.\n",
        rev.version,
        rev.revision,
        if rev.dirty == Some(true) {
            " (with uncommitted changes)"
        } else {
            ""
        },
        results.settings.runtime_s,
        results.settings.reps,
        if results.settings.reps == 1 { "" } else { "s" },
        results.settings.warmup_s,
        if results.settings.quick {
            ", --quick (sizes and runtimes too small to judge speed)"
        } else {
            ""
        },
        results.command.join(" ")
    );
    let _ = writeln!(
        s,
        "Each cell is the median of the repetitions, with min and max. **x native** and **x \
         best anchor** (lanefs rows) are speed-ups: above 1 lanefs is faster, for rates and \
         times alike. Native is the same workload on the file system lanefs and the \
         passthrough anchors are backed by; the best anchor is the fastest existing FUSE \
         server (libfuse example, qemu-storage-daemon, passthrough_hp) in the same table. \
         **server CPU s** is the CPU time (user + system, its threads and children) the \
         server process used per run, and **ops/CPU-s** the run's operations (fio's I/Os, \
         files created or removed, lseeks and preads, 1 MiB dd blocks) per second of it \
         (\"< 1 tick\": under one clock tick, {} s); **x hp CPU** (lanefs passthrough rows) \
         is that against the most frugal passthrough_hp row of the same workload with kernel \
         passthrough alike: above 1 lanefs spends less CPU per operation. Every run's raw \
         numbers are in results.json.\n",
        results.tools["cpu_clock_tick_s"]
    );
    if let Some(tools) = results.tools.as_object() {
        let mut parts = Vec::new();
        if let Some(v) = tools.get("fio").and_then(|f| f.get("version")) {
            parts.push(format!("fio {}", v.as_str().unwrap_or("?")));
        }
        if let Some(v) = tools.get("libfuse").and_then(|v| v.as_str()) {
            parts.push(format!("libfuse {v} (examples compiled from libfuse3-dev)"));
        }
        if let Some(v) = tools.get("qemu_storage_daemon").and_then(|v| v.as_str()) {
            parts.push(v.to_owned());
        }
        if let Some(given) = tools.get("anchors_by_path").and_then(|v| v.as_object()) {
            for (name, path) in given {
                parts.push(format!("{name} {}", path.as_str().unwrap_or("?")));
            }
        }
        if !parts.is_empty() {
            let _ = writeln!(s, "Tools: {}.\n", parts.join(", "));
        }
    }
    if results.interrupted {
        let _ = writeln!(s, "**Interrupted**: the results below are partial.\n");
    }
    for note in &results.notes {
        let _ = writeln!(s, "- {}", escape(note));
    }
    if !results.notes.is_empty() {
        s.push('\n');
    }

    for suite in &results.suites {
        let _ = writeln!(s, "## {}: {}\n", suite.name, suite.title);
        let _ = writeln!(s, "{}\n", suite.seed);
        if !suite.aims.is_empty() {
            let _ = writeln!(s, "**Aims** (the issues' targets), from the medians:\n");
            for a in &suite.aims {
                let _ = writeln!(s, "- {a}");
            }
            s.push('\n');
        }
        let mut families: Vec<&str> = Vec::new();
        for r in &suite.rows {
            if !families.contains(&r.family.as_str()) {
                families.push(&r.family);
            }
        }
        for family in families {
            let rows: Vec<&Row> = suite.rows.iter().filter(|r| r.family == family).collect();
            let unit = rows[0].unit;
            let _ = writeln!(
                s,
                "### {family} ({}, {} is better)\n",
                unit.name,
                if unit.higher_is_better {
                    "higher"
                } else {
                    "lower"
                }
            );
            let _ = writeln!(
                s,
                "| workload | system | median | min | max | x native | x best anchor | \
                 server CPU s | ops/CPU-s | x hp CPU |"
            );
            let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
            let mut workloads: Vec<&str> = Vec::new();
            for r in &rows {
                if !workloads.contains(&r.workload.as_str()) {
                    workloads.push(&r.workload);
                }
            }
            for w in workloads {
                for r in rows.iter().filter(|r| r.workload == w) {
                    let system = if r.role == crate::bench::model::Role::Lanefs {
                        format!("**{}**", r.system)
                    } else {
                        r.system.clone()
                    };
                    match (&r.status, r.summary) {
                        (Status::Ok, Some(sum)) => {
                            let (cpu_s, per_cpu) = cpu_cells(r.server_cpu);
                            let _ = writeln!(
                                s,
                                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                                escape(w),
                                system,
                                fmt_value(sum.median, unit),
                                fmt_value(sum.min, unit),
                                fmt_value(sum.max, unit),
                                ratio(r.vs_native),
                                ratio(r.vs_best_anchor),
                                cpu_s,
                                per_cpu,
                                ratio(r.cpu_vs_passthrough_hp),
                            );
                        }
                        (Status::Failed { error }, _) => {
                            let _ = writeln!(
                                s,
                                "| {} | {} | failed: {} | | | | | | | |",
                                escape(w),
                                system,
                                escape(error)
                            );
                        }
                        (Status::Ok, None) => {
                            let _ = writeln!(
                                s,
                                "| {} | {} | no runs | | | | | | | |",
                                escape(w),
                                system
                            );
                        }
                    }
                }
            }
            s.push('\n');
            let svg = chart::file_stem(&suite.name, family) + ".svg";
            if results.charts.contains(&svg) {
                let png = chart::file_stem(&suite.name, family) + ".png";
                let _ = write!(s, "![{} {family}]({svg})", suite.name);
                if results.charts.contains(&png) {
                    let _ = write!(s, " ([PNG]({png}))");
                }
                s.push_str("\n\n");
            }
        }
        if !suite.notes.is_empty() {
            let _ = writeln!(s, "Notes:\n");
            for n in &suite.notes {
                let _ = writeln!(s, "- {}", escape(n));
            }
            s.push('\n');
        }
        if !suite.skipped.is_empty() {
            let _ = writeln!(s, "Skipped:\n");
            for n in &suite.skipped {
                let _ = writeln!(s, "- {}", escape(n));
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(fmt_value(1_234_567.0, Unit::IOPS), "1.23M");
        assert_eq!(fmt_value(45_678.0, Unit::IOPS), "45.7k");
        assert_eq!(fmt_value(3456.4, Unit::MIBS), "3456");
        assert_eq!(fmt_value(12345.6, Unit::MIBS), "12346");
        assert_eq!(fmt_value(0.0, Unit::IOPS), "0");
        assert_eq!(fmt_value(1.23456, Unit::SECONDS), "1.235");
        assert_eq!(fmt_value(18.64, Unit::SECONDS), "18.6");
        assert_eq!(ratio(Some(1.456)), "1.46x");
        assert_eq!(ratio(None), "");
    }

    #[test]
    fn cpu_cells() {
        assert_eq!(super::cpu_cells(None), (String::new(), String::new()));
        let cpu = |ops_per_cpu_s| {
            Some(CpuSummary {
                cpu_s: 0.4567,
                ops: 1000.0,
                ops_per_cpu_s,
            })
        };
        assert_eq!(
            super::cpu_cells(cpu(Some(2189.6))),
            ("0.457".to_owned(), "2190".to_owned())
        );
        assert_eq!(super::cpu_cells(cpu(None)).1, "< 1 tick");
    }
}
