//! The suites: which workloads meet which systems, one per seed write-up.

mod dd;
mod engine;
mod files;
mod queues;
mod seek;
mod ssf;

use crate::bench::Suite;
use crate::bench::fio::FioJob;
use crate::bench::model::{SuiteResult, Unit};
use crate::bench::runner::{Ctx, Plan, Stop};
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
        Suite::Create => files::plan_create(ctx),
        Suite::Untar => files::plan_untar(ctx),
        Suite::Dd => dd::plan(ctx),
    };
    let uses_fio = matches!(suite, Suite::Engine | Suite::Ssf | Suite::Queues);
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
    if suite == Suite::Engine {
        engine::aims(&mut result);
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

/// A 4k fio job on one shared file: `engine` is "psync" or "libaio" (iodepth 16).
fn fio_4k(rw: &str, engine: &str, numjobs: u32, quick: bool) -> Workload {
    let (engine_label, iodepth) = if engine == "libaio" {
        ("libaio qd16", 16)
    } else {
        (engine, 1)
    };
    let family = format!("4k {rw} {engine_label}");
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
            shared_file: shared,
            size: size.into(),
            region: "4G".into(),
        },
    )
}

/// Sorted, without duplicates.
fn distinct(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}
