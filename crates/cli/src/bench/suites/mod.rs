//! The suites: which workloads meet which systems, one per seed write-up.

mod apps;
mod dd;
mod engine;
mod files;
mod hotpath;
mod passthrough;
mod queues;
mod seek;
mod ssf;
mod transport;

use crate::bench::Suite;
use crate::bench::fio::FioJob;
use crate::bench::model::{Role, Row, Status, SuiteResult, Unit, better, speedup};
use crate::bench::runner::{Ctx, Plan, Stop};
use crate::bench::systems::SystemSpec;
use crate::bench::workloads::{UNPRIVILEGED_ID, Workload};

/// A suite's header and what it will run.
pub struct SuitePlan {
    pub result: SuiteResult,
    pub plans: Vec<Plan>,
}

fn plan(suite: Suite, ctx: &Ctx) -> SuitePlan {
    let mut p = match suite {
        Suite::Engine => engine::plan(ctx),
        Suite::Ssf => ssf::plan(ctx),
        Suite::Queues => queues::plan(ctx),
        Suite::Seek => seek::plan(ctx),
        Suite::Passthrough => passthrough::plan(ctx),
        Suite::Transport => transport::plan(ctx),
        Suite::Create => files::plan_create(ctx),
        Suite::Untar => files::plan_untar(ctx),
        Suite::Dd => dd::plan(ctx),
        Suite::Apps => apps::plan(ctx),
        Suite::Hotpath => hotpath::plan(ctx),
    };
    let uses_fio = matches!(
        suite,
        Suite::Engine
            | Suite::Ssf
            | Suite::Queues
            | Suite::Passthrough
            | Suite::Transport
            | Suite::Hotpath
    );
    if uses_fio && let Err(why) = &ctx.fio {
        p.result.skip(format!("every row: {why}"));
        p.plans.clear();
    }
    if !ctx.settings.systems.is_empty() {
        let wanted = |label: &str| {
            let label = label.to_lowercase();
            ctx.settings
                .systems
                .iter()
                .any(|s| label.contains(&s.to_lowercase()))
        };
        let mut left_out = Vec::new();
        p.plans.retain(|plan| {
            let label = plan.system.label(ctx);
            let keep = plan.system.role() == Role::Native || wanted(&label);
            if !keep {
                left_out.push(label);
            }
            keep
        });
        if !left_out.is_empty() {
            p.result.note(format!(
                "left out of this run (--system): {}",
                left_out.join(", ")
            ));
        }
    }
    p
}

/// How many measured runs a suite will make (for the progress bar).
pub fn planned_runs(suite: Suite, ctx: &Ctx) -> u64 {
    let p = plan(suite, ctx);
    let workloads: usize = p.plans.iter().map(|p| p.workloads.len()).sum();
    workloads as u64 * u64::from(ctx.settings.reps)
}

pub fn run(suite: Suite, ctx: &mut Ctx) -> Result<SuiteResult, Stop> {
    let SuitePlan {
        mut result,
        mut plans,
    } = plan(suite, ctx);
    match suite {
        Suite::Untar => plans = files::prepare_tarballs(ctx, &mut result, plans),
        Suite::Apps => plans = apps::prepare(ctx, &mut result, plans),
        _ => {}
    }
    let outcome = ctx.execute(&mut result, plans);
    match suite {
        Suite::Engine => engine::aims(&mut result),
        Suite::Seek => seek::aims(&mut result),
        Suite::Passthrough => passthrough::aims(&mut result),
        Suite::Transport => transport::aims(&mut result),
        Suite::Hotpath => hotpath::aims(&mut result),
        Suite::Create | Suite::Untar => files::aims(&mut result),
        Suite::Ssf => ssf::aims(&mut result),
        Suite::Dd => dd::aims(&mut result),
        Suite::Apps => apps::aims(&mut result),
        _ => {}
    }
    match outcome {
        Ok(()) => Ok(result),
        Err(()) => {
            result.note("interrupted: this suite's remaining runs were not made");
            Err(Stop::Interrupted(Box::new(result)))
        }
    }
}

fn jobs(n: u32, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// A 4k direct fio job on one shared file: `engine` is "psync" or "libaio" (iodepth 16).
fn fio_4k(rw: &str, engine: &str, numjobs: u32, quick: bool) -> Workload {
    fio_4k_io(rw, engine, numjobs, quick, true)
}

/// A 4k fio job on one shared file, direct or through the page cache.
fn fio_4k_io(rw: &str, engine: &str, numjobs: u32, quick: bool, direct: bool) -> Workload {
    let (engine_label, iodepth) = if engine == "libaio" {
        ("libaio qd16", 16)
    } else {
        (engine, 1)
    };
    let family = format!(
        "4k {rw} {engine_label}{}",
        if direct { "" } else { " buffered" }
    );
    Workload::fio(
        format!("{family}, {}", jobs(numjobs, "job")),
        family,
        Unit::IOPS,
        FioJob {
            rw: rw.into(),
            bs: "4k".into(),
            ioengine: engine.into(),
            iodepth,
            numjobs,
            direct,
            shared_file: true,
            size: if quick { "64M" } else { "1G" }.into(),
            region: "1G".into(),
        },
    )
}

/// Seed 000's job: 1 MiB direct writes, randwrite:256 with the sequential sequencer.
fn fio_seed000(shared: bool, numjobs: u32, quick: bool) -> Workload {
    let family = format!(
        "1M randwrite:256 {}",
        if shared {
            "shared file"
        } else {
            "file per job"
        }
    );
    let size = match (shared, quick) {
        (true, true) => "256M",
        (true, false) => "1G",
        (false, true) => "64M",
        (false, false) => "256M",
    };
    Workload::fio(
        format!("{family}, {}", jobs(numjobs, "job")),
        family,
        Unit::MIBS,
        FioJob {
            rw: "randwrite:256".into(),
            bs: "1M".into(),
            ioengine: "psync".into(),
            iodepth: 1,
            numjobs,
            direct: true,
            shared_file: shared,
            size: size.into(),
            region: "4G".into(),
        },
    )
}

/// passthrough_hp's best configurations (`--anchor passthrough_hp=PATH`): over io_uring and
/// on cloned fds, with kernel passthrough; with `daemon_served`, also both with
/// `--nopassthrough`, for suites that compare I/O served by the server.
fn passthrough_hp(daemon_served: bool) -> Vec<SystemSpec> {
    let kinds: &[bool] = if daemon_served {
        &[true, false]
    } else {
        &[true]
    };
    kinds
        .iter()
        .flat_map(|&kernel_passthrough| {
            [true, false].map(|uring| SystemSpec::PassthroughHp {
                uring,
                kernel_passthrough,
            })
        })
        .collect()
}

/// lanefs's volume on its embedded defaults over both transports: `cores` cloned /dev/fuse
/// queues, and io_uring.
fn volumes(cores: usize) -> [SystemSpec; 2] {
    [false, true].map(|uring| SystemSpec::LanefsVolume {
        queues: cores,
        uring,
        async_dirops: true,
    })
}

/// Whether a row's system is the volume on PostgreSQL (by its label).
fn is_on_postgres(system: &str) -> bool {
    system.starts_with("lanefs volume on PostgreSQL")
}

/// lanefs's volume on PostgreSQL (issue 14), one mount: over `cores` cloned /dev/fuse
/// queues and io_uring, over io_uring with `--async-commit`, and over io_uring with its
/// blocks on S3 (the shared configuration: metadata and data both off the machine).
fn volumes_on_postgres(cores: usize) -> [SystemSpec; 4] {
    [
        (false, false, false),
        (true, false, false),
        (true, true, false),
        (true, false, true),
    ]
    .map(|(uring, async_commit, s3)| SystemSpec::LanefsVolumePg {
        queues: cores,
        uring,
        async_commit,
        async_dirops: true,
        mounts: 1,
        s3,
    })
}

/// Issue 13's aims for the volume (issue 14's on PostgreSQL), one line per volume row of
/// `workload` on SQLite (on PostgreSQL): its median against a fixed bar `target` (in the
/// workload's unit; a speed-up of at least 1 meets it).
fn volume_target_lines(
    result: &SuiteResult,
    workload: &str,
    on_postgres: bool,
    target: f64,
    aim: &str,
) -> Vec<String> {
    result
        .rows
        .iter()
        .filter(|r| {
            r.workload == workload
                && r.system.starts_with("lanefs volume")
                && is_on_postgres(&r.system) == on_postgres
                && r.status == Status::Ok
        })
        .filter_map(|r| {
            let median = r.summary?.median;
            aim_line(
                workload,
                &(r.system.clone(), median),
                &("the aim".to_owned(), target),
                r.unit,
                1.0,
                aim,
            )
        })
        .collect()
}

/// Every system meets the same workloads.
fn plans_for(systems: impl IntoIterator<Item = SystemSpec>, workloads: &[Workload]) -> Vec<Plan> {
    systems
        .into_iter()
        .map(|system| Plan {
            system,
            workloads: workloads.to_vec(),
        })
        .collect()
}

/// Sorted, without duplicates.
fn distinct(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The best median among a workload's measured rows that `pick` accepts: (system, median).
fn best_median(
    result: &SuiteResult,
    workload: &str,
    pick: impl Fn(&Row) -> bool,
) -> Option<(String, f64)> {
    result
        .rows
        .iter()
        .filter(|r| r.workload == workload && r.status == Status::Ok && pick(r))
        .filter_map(|r| r.summary.map(|s| (r, s.median)))
        .fold(None::<(&Row, f64)>, |best, (r, m)| match best {
            Some((_, bm)) if !better(m, bm, r.unit) => best,
            _ => Some((r, m)),
        })
        .map(|(r, m)| (r.system.clone(), m))
}

/// The suite's workloads in the order their rows appear.
fn workloads_of(result: &SuiteResult) -> Vec<(String, Unit)> {
    let mut seen: Vec<(String, Unit)> = Vec::new();
    for r in &result.rows {
        if !seen.iter().any(|(w, _)| *w == r.workload) {
            seen.push((r.workload.clone(), r.unit));
        }
    }
    seen
}

/// One aim line: `ours` against `theirs` as a speed-up, and whether it reaches `at_least`.
fn aim_line(
    what: &str,
    ours: &(String, f64),
    theirs: &(String, f64),
    unit: Unit,
    at_least: f64,
    aim: &str,
) -> Option<String> {
    let ratio = speedup(ours.1, theirs.1, unit)?;
    Some(format!(
        "{what}: {} ({:.3}) = **{ratio:.2}x** {} ({:.3}); aim {aim}: {}",
        ours.0,
        ours.1,
        theirs.0,
        theirs.1,
        if ratio >= at_least { "met" } else { "NOT met" }
    ))
}

/// One condition of an aim: at least `at_least` times `row`'s median (as a speed-up); `label`
/// names the row when it is missing.
struct Bar<'a> {
    label: &'a str,
    row: Option<&'a (String, f64)>,
    at_least: f64,
}

fn bar<'a>(label: &'a str, row: Option<&'a (String, f64)>, at_least: f64) -> Bar<'a> {
    Bar {
        label,
        row,
        at_least,
    }
}

/// One aim line against several rows: `ours` must clear every bar; a missing row leaves it
/// not judged.
fn aim_line_all(what: &str, ours: &(String, f64), bars: &[Bar], unit: Unit, aim: &str) -> String {
    let mut parts = Vec::new();
    let mut met = true;
    let mut missing = Vec::new();
    for bar in bars {
        match bar.row.and_then(|t| Some((t, speedup(ours.1, t.1, unit)?))) {
            Some((theirs, ratio)) => {
                parts.push(format!("**{ratio:.2}x** {} ({:.3})", theirs.0, theirs.1));
                met &= ratio >= bar.at_least;
            }
            None => missing.push(bar.label),
        }
    }
    let verdict = match (missing.is_empty(), met) {
        (true, true) => "met".to_owned(),
        (_, false) => "NOT met".to_owned(),
        (false, true) => format!("not judged (no {} row)", missing.join(", no ")),
    };
    format!(
        "{what}: {} ({:.3}) = {}; aim {aim}: {verdict}",
        ours.0,
        ours.1,
        if parts.is_empty() {
            "no row to compare with".to_owned()
        } else {
            parts.join(", ")
        }
    )
}

/// Issue 4's comparison on one workload: for lanefs passthrough with kernel passthrough on
/// and with it off, the best io_uring row against the best cloned-fd row of the same kind.
fn uring_lines(
    result: &SuiteResult,
    workload: &str,
    unit: Unit,
    at_least: f64,
    aim: &str,
) -> Vec<String> {
    let no_passthrough = |r: &Row| r.system.ends_with("no-passthrough");
    let passthrough =
        |r: &Row| r.role == Role::Lanefs && r.system.starts_with("lanefs passthrough");
    let mut lines = Vec::new();
    for kind in [false, true] {
        let ours = best_median(result, workload, |r| {
            passthrough(r) && r.system.contains("io_uring") && no_passthrough(r) == kind
        });
        let theirs = best_median(result, workload, |r| {
            passthrough(r) && !r.system.contains("io_uring") && no_passthrough(r) == kind
        });
        if let (Some(ours), Some(theirs)) = (ours, theirs) {
            lines.extend(aim_line(
                &format!("{workload}, io_uring vs /dev/fuse"),
                &ours,
                &theirs,
                unit,
                at_least,
                aim,
            ));
        }
    }
    lines
}

/// The unprivileged caller's rows against the same workload run by the bench's user (root),
/// system by system: no aim, so that issue 11's costs for other callers stay visible.
fn caller_lines(result: &SuiteResult) -> Vec<String> {
    let suffix = format!(", as uid {UNPRIVILEGED_ID}");
    let median = |r: &Row| {
        r.summary
            .filter(|_| r.status == Status::Ok)
            .map(|s| s.median)
    };
    let mut lines = Vec::new();
    for other in &result.rows {
        let Some(root_workload) = other.workload.strip_suffix(&suffix) else {
            continue;
        };
        let Some(root) = result.row(root_workload, &other.system) else {
            continue;
        };
        if let (Some(theirs), Some(ours)) = (median(root), median(other))
            && let Some(ratio) = speedup(ours, theirs, other.unit)
        {
            lines.push(format!(
                "{root_workload} on {}: as uid {UNPRIVILEGED_ID} {} {}, as root {} = **{ratio:.2}x** \
                 (no aim: issue 11's costs for callers other than root)",
                other.system,
                crate::bench::report::fmt_value(ours, other.unit),
                other.unit.name,
                crate::bench::report::fmt_value(theirs, other.unit),
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::model::Summary;

    fn row(workload: &str, system: &str, role: Role, median: f64) -> Row {
        Row {
            workload: workload.into(),
            family: workload.into(),
            numjobs: 1,
            system: system.into(),
            role,
            unit: Unit::IOPS,
            workload_config: serde_json::Value::Null,
            system_config: serde_json::Value::Null,
            status: Status::Ok,
            runs: Vec::new(),
            summary: Some(Summary {
                median,
                min: median,
                max: median,
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
    fn an_aim_against_several_rows_needs_them_all() {
        let ours = ("lanefs".to_owned(), 90.0);
        let native = ("native".to_owned(), 100.0);
        let hp = ("hp".to_owned(), 80.0);
        let line = |hp: Option<&(String, f64)>, native_at_least| {
            aim_line_all(
                "w",
                &ours,
                &[
                    bar("native", Some(&native), native_at_least),
                    bar("hp", hp, 1.0),
                ],
                Unit::IOPS,
                "both",
            )
        };
        let met = line(Some(&hp), 0.9);
        assert!(
            met.contains("**0.90x** native (100.000), **1.12x** hp (80.000)"),
            "{met}"
        );
        assert!(met.ends_with("aim both: met"), "{met}");
        assert!(line(Some(&hp), 0.95).ends_with("NOT met"));
        assert!(line(None, 0.9).ends_with("not judged (no hp row)"));
        // A condition already missed is missed, whatever else is absent.
        assert!(line(None, 0.95).ends_with("NOT met"));
        // Lower is better: 50 µs against 100 µs is 2x.
        let p99 = aim_line_all(
            "p99",
            &("l".to_owned(), 50.0),
            &[bar("a", Some(&("a".to_owned(), 100.0)), 1.0)],
            Unit::MICROS,
            "at or below",
        );
        assert!(p99.contains("**2.00x**") && p99.ends_with("met"), "{p99}");
    }

    #[test]
    fn unprivileged_rows_are_set_against_root_on_the_same_system() {
        let mut result = SuiteResult::new(Suite::Passthrough, "t", "s");
        let other = format!("4k randwrite psync, 1 job, as uid {UNPRIVILEGED_ID}");
        result.rows = vec![
            row("4k randwrite psync, 1 job", "a", Role::Lanefs, 200.0),
            row("4k randwrite psync, 1 job", "b", Role::Anchor, 100.0),
            row(&other, "a", Role::Lanefs, 150.0),
            row(&other, "c", Role::Native, 10.0),
        ];
        let lines = caller_lines(&result);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("4k randwrite psync, 1 job on a: as uid 65534 150 IOPS, as root 200")
                && lines[0].contains("**0.75x**"),
            "{}",
            lines[0]
        );
    }
}
