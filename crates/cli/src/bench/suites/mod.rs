//! The suites: which workloads meet which systems, one per seed write-up.

mod dd;
mod engine;
mod files;
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
use crate::bench::workloads::Workload;

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
    };
    let uses_fio = matches!(
        suite,
        Suite::Engine | Suite::Ssf | Suite::Queues | Suite::Passthrough | Suite::Transport
    );
    if uses_fio && let Err(why) = &ctx.fio {
        p.result.skip(format!("every row: {why}"));
        p.plans.clear();
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
    if suite == Suite::Untar {
        plans = files::prepare_tarballs(ctx, &mut result, plans);
    }
    let outcome = ctx.execute(&mut result, plans);
    match suite {
        Suite::Engine => engine::aims(&mut result),
        Suite::Passthrough => passthrough::aims(&mut result),
        Suite::Transport => transport::aims(&mut result),
        Suite::Create | Suite::Untar => files::aims(&mut result),
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

/// Issue 4's comparison on one workload: the best lanefs io_uring row against the best lanefs
/// cloned-fd row of the same kind (kernel passthrough on or off alike).
fn uring_line(
    result: &SuiteResult,
    workload: &str,
    unit: Unit,
    at_least: f64,
    aim: &str,
) -> Option<String> {
    let kind = |r: &Row| r.system.ends_with("no-passthrough");
    let ring = result.rows.iter().find(|r| {
        r.workload == workload && r.role == Role::Lanefs && r.system.contains("io_uring")
    })?;
    let uring_kind = kind(ring);
    let ours = best_median(result, workload, |r| {
        r.role == Role::Lanefs && r.system.contains("io_uring") && kind(r) == uring_kind
    })?;
    let theirs = best_median(result, workload, |r| {
        r.role == Role::Lanefs && !r.system.contains("io_uring") && kind(r) == uring_kind
    })?;
    aim_line(
        &format!("{workload}, io_uring vs /dev/fuse"),
        &ours,
        &theirs,
        unit,
        at_least,
        aim,
    )
}
