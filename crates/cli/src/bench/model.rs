//! What a bench produces: rows (one workload on one system, every run's raw numbers), their
//! summaries (median, min, max) and ratios, per suite; and the math behind them.

use serde::Serialize;
use serde_json::Value;

use crate::bench::Suite;
use crate::bench::machine::{Machine, Revision, Utc};
use crate::bench::runner::Ctx;

/// What a number measures and which direction is better.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    pub higher_is_better: bool,
}

impl Unit {
    pub const IOPS: Unit = Unit {
        name: "IOPS",
        higher_is_better: true,
    };
    pub const MIBS: Unit = Unit {
        name: "MiB/s",
        higher_is_better: true,
    };
    pub const SECONDS: Unit = Unit {
        name: "s",
        higher_is_better: false,
    };
    pub const SEEKS: Unit = Unit {
        name: "lseeks/s",
        higher_is_better: true,
    };
    pub const TPS: Unit = Unit {
        name: "TPS",
        higher_is_better: true,
    };
    pub const CREATES: Unit = Unit {
        name: "creates/s",
        higher_is_better: true,
    };
    pub const MICROS: Unit = Unit {
        name: "µs",
        higher_is_better: false,
    };
}

/// Whose row it is: ratios are lanefs against native and against the best anchor.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Lanefs,
    Native,
    Anchor,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed { error: String },
}

/// What one run did, for CPU per operation: its operations (fio's I/Os, files created,
/// lseeks and preads, ...) and the CPU time the server spent meanwhile.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub ops: f64,
    /// None on systems without a server process (native).
    pub server_cpu_s: Option<f64>,
}

/// One measured run: the row's number and what the tool reported.
#[derive(Serialize, Clone, Debug)]
pub struct RunRecord {
    pub value: f64,
    /// On the rows that count the run's work (not on a p99 row of the same run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work: Option<Work>,
    pub raw: Value,
}

#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

/// A row's server CPU over its runs, as medians.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct CpuSummary {
    /// Server CPU seconds per run.
    pub cpu_s: f64,
    /// Operations per run.
    pub ops: f64,
    /// Operations per server CPU-second; None when the server used less than one clock tick
    /// in every run (all of the work done in the kernel).
    pub ops_per_cpu_s: Option<f64>,
}

/// One workload (one metric of it) on one system.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    /// Unique within the suite, e.g. "4k randread psync, 2 jobs".
    pub workload: String,
    /// The chart a row belongs to (the workload without its job count).
    pub family: String,
    /// The chart's x axis: jobs, threads or processes.
    pub numjobs: u32,
    pub system: String,
    pub role: Role,
    pub unit: Unit,
    pub workload_config: Value,
    pub system_config: Value,
    pub status: Status,
    pub runs: Vec<RunRecord>,
    pub summary: Option<Summary>,
    /// lanefs rows: this row against the suite's native row of the same workload, as a
    /// speed-up (>1: lanefs is faster, whichever direction the unit is better in).
    pub vs_native: Option<f64>,
    pub native: Option<String>,
    /// lanefs rows: against the best anchor row of the same workload, as a speed-up.
    pub vs_best_anchor: Option<f64>,
    pub best_anchor: Option<String>,
    /// Rows that count work on systems with a server: its CPU per run and ops per CPU-second.
    pub server_cpu: Option<CpuSummary>,
    /// lanefs passthrough rows: ops per CPU-second against the most frugal passthrough_hp row
    /// of the same workload and kernel-passthrough setting (>1: lanefs spends less CPU per
    /// operation).
    pub cpu_vs_passthrough_hp: Option<f64>,
    pub passthrough_hp: Option<String>,
}

#[derive(Serialize, Clone, Debug)]
pub struct SuiteResult {
    pub name: String,
    pub title: String,
    /// The seed write-up it reproduces, and how.
    pub seed: String,
    pub notes: Vec<String>,
    /// "what: why" for each system or combination not run.
    pub skipped: Vec<String>,
    pub rows: Vec<Row>,
    /// The figure a suite checks against the aims, if any.
    pub aims: Vec<String>,
}

impl SuiteResult {
    pub fn new(suite: Suite, title: &str, seed: &str) -> SuiteResult {
        SuiteResult {
            name: suite.name().into(),
            title: title.into(),
            seed: seed.into(),
            notes: Vec::new(),
            skipped: Vec::new(),
            rows: Vec::new(),
            aims: Vec::new(),
        }
    }

    pub fn skip(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.skipped.contains(&what) {
            self.skipped.push(what);
        }
    }

    pub fn note(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.notes.contains(&what) {
            self.notes.push(what);
        }
    }

    pub fn row(&self, workload: &str, system: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.workload == workload && r.system == system)
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct Settings {
    pub quick: bool,
    pub runtime_s: f64,
    pub reps: u32,
    pub warmup_s: f64,
    pub fio: Option<String>,
    pub lanefs_args: Vec<String>,
}

#[derive(Serialize, Clone, Debug)]
pub struct BenchResults {
    pub schema: u32,
    pub started: String,
    pub finished: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub lanefs: Revision,
    pub settings: Settings,
    /// Versions of the tools the numbers came through (fio, libfuse, ...).
    pub tools: Value,
    pub suites_requested: Vec<String>,
    pub interrupted: bool,
    pub notes: Vec<String>,
    pub suites: Vec<SuiteResult>,
    /// Chart files written next to the report.
    pub charts: Vec<String>,
}

impl BenchResults {
    pub fn new(ctx: &Ctx, started: Utc, suites: &[Suite]) -> BenchResults {
        BenchResults {
            // 2: server CPU per run (RunRecord.work, Row.server_cpu, cpu_vs_passthrough_hp).
            schema: 2,
            started: started.iso(),
            finished: String::new(),
            command: std::env::args().collect(),
            machine: ctx.machine.clone(),
            lanefs: Revision::probe(),
            settings: ctx.settings_model(),
            tools: Value::Null,
            suites_requested: suites.iter().map(|s| s.name().to_owned()).collect(),
            interrupted: false,
            notes: Vec::new(),
            suites: Vec::new(),
            charts: Vec::new(),
        }
    }

    pub fn finish(&mut self, ctx: &Ctx, interrupted: bool) {
        self.finished = crate::bench::machine::now_utc().iso();
        self.interrupted = interrupted;
        self.tools = ctx.tools_json();
        self.notes.extend(ctx.global_notes());
    }
}

/// Median (mean of the middle two for an even count), min and max; None when empty.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        runs: n,
    })
}

/// Medians of the server's CPU per run, the operations per run and their ratio; None when
/// no run measured a server.
pub fn summarize_cpu(runs: &[RunRecord]) -> Option<CpuSummary> {
    let measured: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.work.and_then(|w| Some((w.ops, w.server_cpu_s?))))
        .collect();
    let cpu_s = summarize(&measured.iter().map(|m| m.1).collect::<Vec<_>>())?.median;
    let ops = summarize(&measured.iter().map(|m| m.0).collect::<Vec<_>>())?.median;
    let rates: Vec<f64> = measured
        .iter()
        .filter(|(_, cpu)| *cpu > 0.0)
        .map(|(ops, cpu)| ops / cpu)
        .collect();
    Some(CpuSummary {
        cpu_s,
        ops,
        ops_per_cpu_s: summarize(&rates).map(|s| s.median),
    })
}

/// How much faster `ours` is than `theirs`: ours/theirs when higher is better, theirs/ours
/// when lower is (times, latencies). None when either is not a positive number.
pub fn speedup(ours: f64, theirs: f64, unit: Unit) -> Option<f64> {
    if !(ours > 0.0 && theirs > 0.0 && ours.is_finite() && theirs.is_finite()) {
        return None;
    }
    Some(if unit.higher_is_better {
        ours / theirs
    } else {
        theirs / ours
    })
}

/// Whether `a` is better than `b` in `unit`'s direction.
pub fn better(a: f64, b: f64, unit: Unit) -> bool {
    if unit.higher_is_better { a > b } else { a < b }
}

/// Fills every lanefs row's ratios against the native row (the suite's first native system
/// for that workload) and the best anchor row of the same workload in the same suite.
pub fn compute_ratios(results: &mut BenchResults) {
    for suite in &mut results.suites {
        let snapshot: Vec<(String, String, Role, Option<f64>)> = suite
            .rows
            .iter()
            .map(|r| {
                (
                    r.workload.clone(),
                    r.system.clone(),
                    r.role,
                    r.summary.map(|s| s.median),
                )
            })
            .collect();
        for row in &mut suite.rows {
            if row.role != Role::Lanefs {
                continue;
            }
            let Some(ours) = row.summary.map(|s| s.median) else {
                continue;
            };
            let same = || {
                snapshot
                    .iter()
                    .filter(|(w, ..)| *w == row.workload)
                    .filter_map(|(_, sys, role, m)| m.map(|m| (sys, *role, m)))
            };
            if let Some((sys, _, native)) = same().find(|(_, role, _)| *role == Role::Native) {
                row.vs_native = speedup(ours, native, row.unit);
                row.native = Some(sys.clone());
            }
            let best = same().filter(|(_, role, _)| *role == Role::Anchor).fold(
                None::<(&String, f64)>,
                |best, (sys, _, m)| match best {
                    Some((_, b)) if !better(m, b, row.unit) => best,
                    _ => Some((sys, m)),
                },
            );
            if let Some((sys, anchor)) = best {
                row.vs_best_anchor = speedup(ours, anchor, row.unit);
                row.best_anchor = Some(sys.clone());
            }
        }
        compare_cpu_with_passthrough_hp(suite);
    }
}

/// Fills `cpu_vs_passthrough_hp` on lanefs passthrough rows: their ops per CPU-second against
/// the best passthrough_hp row of the same workload with kernel passthrough alike.
fn compare_cpu_with_passthrough_hp(suite: &mut SuiteResult) {
    let hp: Vec<(String, Value, String, f64)> = suite
        .rows
        .iter()
        .filter(|r| r.system_config["system"] == "passthrough_hp")
        .filter_map(|r| {
            let rate = r.server_cpu?.ops_per_cpu_s?;
            Some((
                r.workload.clone(),
                r.system_config["kernel_passthrough"].clone(),
                r.system.clone(),
                rate,
            ))
        })
        .collect();
    for row in &mut suite.rows {
        if row.role != Role::Lanefs || row.system_config["fs"] != "passthrough" {
            continue;
        }
        let Some(ours) = row.server_cpu.and_then(|c| c.ops_per_cpu_s) else {
            continue;
        };
        let kernel_passthrough = &row.system_config["kernel_passthrough"];
        let best = hp
            .iter()
            .filter(|(w, kp, ..)| *w == row.workload && kp == kernel_passthrough)
            .max_by(|a, b| a.3.total_cmp(&b.3));
        if let Some((_, _, system, rate)) = best {
            row.cpu_vs_passthrough_hp = speedup(ours, *rate, Unit::IOPS);
            row.passthrough_hp = Some(system.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        assert_eq!(summarize(&[]), None);
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        let s = summarize(&[7.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (7.0, 7.0, 7.0));
        // NaN never wins a place.
        let s = summarize(&[f64::NAN, 5.0, 1.0]).unwrap();
        assert_eq!((s.median, s.runs), (3.0, 2));
    }

    #[test]
    fn speedups_follow_the_unit() {
        assert_eq!(speedup(200.0, 100.0, Unit::IOPS), Some(2.0));
        // 1 s against 2 s is twice as fast.
        assert_eq!(speedup(1.0, 2.0, Unit::SECONDS), Some(2.0));
        assert_eq!(speedup(0.0, 2.0, Unit::SECONDS), None);
        assert_eq!(speedup(1.0, f64::NAN, Unit::IOPS), None);
        assert!(better(2.0, 1.0, Unit::MIBS) && better(1.0, 2.0, Unit::MICROS));
    }

    fn row(workload: &str, system: &str, role: Role, unit: Unit, median: Option<f64>) -> Row {
        Row {
            workload: workload.into(),
            family: workload.into(),
            numjobs: 1,
            system: system.into(),
            role,
            unit,
            workload_config: Value::Null,
            system_config: Value::Null,
            status: Status::Ok,
            runs: Vec::new(),
            summary: median.map(|m| Summary {
                median: m,
                min: m,
                max: m,
                runs: 1,
            }),
            vs_native: None,
            native: None,
            vs_best_anchor: None,
            best_anchor: None,
            server_cpu: None,
            cpu_vs_passthrough_hp: None,
            passthrough_hp: None,
        }
    }

    #[test]
    fn ratios_against_native_and_best_anchor() {
        let mut suite = SuiteResult::new(Suite::Engine, "t", "s");
        suite.rows = vec![
            row("w", "native", Role::Native, Unit::IOPS, Some(400.0)),
            row("w", "a1", Role::Anchor, Unit::IOPS, Some(50.0)),
            row("w", "a2", Role::Anchor, Unit::IOPS, Some(80.0)),
            row("w", "a3", Role::Anchor, Unit::IOPS, None),
            row("w", "lanefs", Role::Lanefs, Unit::IOPS, Some(100.0)),
            row("other", "a9", Role::Anchor, Unit::IOPS, Some(1.0)),
            row("t", "native", Role::Native, Unit::SECONDS, Some(0.5)),
            row("t", "a1", Role::Anchor, Unit::SECONDS, Some(3.0)),
            row("t", "a2", Role::Anchor, Unit::SECONDS, Some(2.0)),
            row("t", "lanefs", Role::Lanefs, Unit::SECONDS, Some(1.0)),
        ];
        let mut results = BenchResults {
            schema: 1,
            started: String::new(),
            finished: String::new(),
            command: Vec::new(),
            machine: Machine::probe(),
            lanefs: Revision {
                revision: "x".into(),
                dirty: None,
                version: "0".into(),
            },
            settings: Settings {
                quick: true,
                runtime_s: 1.0,
                reps: 1,
                warmup_s: 0.0,
                fio: None,
                lanefs_args: Vec::new(),
            },
            tools: Value::Null,
            suites_requested: Vec::new(),
            interrupted: false,
            notes: Vec::new(),
            suites: vec![suite],
            charts: Vec::new(),
        };
        compute_ratios(&mut results);
        let s = &results.suites[0];
        let l = s.row("w", "lanefs").unwrap();
        assert_eq!(l.vs_native, Some(0.25));
        assert_eq!(l.vs_best_anchor, Some(1.25));
        assert_eq!(l.best_anchor.as_deref(), Some("a2"));
        let t = s.row("t", "lanefs").unwrap();
        assert_eq!(t.vs_native, Some(0.5));
        assert_eq!(t.vs_best_anchor, Some(2.0));
        assert_eq!(t.best_anchor.as_deref(), Some("a2"));
        // Anchors get no ratios of their own.
        assert_eq!(s.row("w", "a1").unwrap().vs_native, None);
    }

    fn run(ops: f64, server_cpu_s: Option<f64>) -> RunRecord {
        RunRecord {
            value: 1.0,
            work: Some(Work { ops, server_cpu_s }),
            raw: Value::Null,
        }
    }

    #[test]
    fn cpu_medians_skip_idle_servers() {
        assert_eq!(summarize_cpu(&[]), None);
        // Native: operations but no server.
        assert_eq!(summarize_cpu(&[run(10.0, None)]), None);
        let c = summarize_cpu(&[
            run(100.0, Some(0.5)),
            run(300.0, Some(1.0)),
            run(200.0, Some(2.0)),
        ])
        .unwrap();
        assert_eq!((c.cpu_s, c.ops, c.ops_per_cpu_s), (1.0, 200.0, Some(200.0)));
        // A server that used no tick has no rate (all of it was done in the kernel).
        let c = summarize_cpu(&[run(100.0, Some(0.0))]).unwrap();
        assert_eq!((c.cpu_s, c.ops_per_cpu_s), (0.0, None));
    }

    #[test]
    fn cpu_against_passthrough_hp_of_the_same_kind() {
        let with_cpu = |system: &str, role, config: Value, rate: f64| {
            let mut r = row("w", system, role, Unit::IOPS, Some(1.0));
            r.system_config = config;
            r.server_cpu = Some(CpuSummary {
                cpu_s: 1.0,
                ops: rate,
                ops_per_cpu_s: Some(rate),
            });
            r
        };
        let hp =
            |kp: bool| serde_json::json!({"system": "passthrough_hp", "kernel_passthrough": kp});
        let lanefs = |kp: bool| serde_json::json!({"system": "lanefs", "fs": "passthrough", "kernel_passthrough": kp});
        let mut suite = SuiteResult::new(Suite::Passthrough, "t", "s");
        suite.rows = vec![
            with_cpu("hp uring", Role::Anchor, hp(true), 100.0),
            with_cpu("hp clone", Role::Anchor, hp(true), 400.0),
            with_cpu("hp uring nop", Role::Anchor, hp(false), 50.0),
            with_cpu("l", Role::Lanefs, lanefs(true), 200.0),
            with_cpu("l nop", Role::Lanefs, lanefs(false), 100.0),
            with_cpu(
                "null",
                Role::Lanefs,
                serde_json::json!({"fs": "null"}),
                100.0,
            ),
        ];
        compare_cpu_with_passthrough_hp(&mut suite);
        let l = suite.row("w", "l").unwrap();
        assert_eq!(l.cpu_vs_passthrough_hp, Some(0.5));
        assert_eq!(l.passthrough_hp.as_deref(), Some("hp clone"));
        let nop = suite.row("w", "l nop").unwrap();
        assert_eq!(nop.cpu_vs_passthrough_hp, Some(2.0));
        assert_eq!(nop.passthrough_hp.as_deref(), Some("hp uring nop"));
        // lanefs null is not a passthrough: nothing to compare with.
        assert_eq!(suite.row("w", "null").unwrap().cpu_vs_passthrough_hp, None);
    }
}
