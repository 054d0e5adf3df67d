//! Issue 3's data path: fio 4k randread/randwrite (psync 1 and 2 jobs, libaio iodepth 16),
//! buffered and direct, and seed 000's shared-file job, on lanefs passthrough with and
//! without kernel passthrough over both transports, against native tmpfs, libfuse's
//! passthrough_ll (single-threaded and with clone_fd) and, given by path, passthrough_hp
//! (io_uring and clone_fd, with kernel passthrough and without). Issue 11's rows for callers
//! other than root: 4k randwrite and creates as uid 65534 next to the same as root. Every
//! source directory is on tmpfs.

use super::{
    SuitePlan, aim_line, aim_line_all, bar, best_median, caller_lines, fio_4k_io, fio_seed000,
    passthrough_hp, uring_lines, workloads_of,
};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Role, Row, SuiteResult, Unit};
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::UNPRIVILEGED_ID;

use super::files::create_workload;

/// The anchor issue 12 sets direct I/O's aim against, by its rows' system name.
const HP_URING: &str = "passthrough_hp io_uring";

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let mut result = SuiteResult::new(
        Suite::Passthrough,
        "The passthrough file system's data path",
        "Issue 3's benchmark: fio 4k randread/randwrite with psync (1 and 2 jobs) and libaio \
         (iodepth 16) on one shared file, through the page cache and with O_DIRECT (issue \
         12's aim table: libaio at 1 and 2 jobs), plus seed 000's 1 MiB shared-file job; \
         issue 11's: 4k randwrite and 10,000 creates by an unprivileged user next to the \
         same by root.",
    );
    let mut fio = Vec::new();
    // --quick checks that the suite runs and reports (CI): one job per row.
    let jobs: &[u32] = if quick { &[1] } else { &[1, 2] };
    for direct in [false, true] {
        for rw in ["randread", "randwrite"] {
            for &nj in jobs {
                fio.push(fio_4k_io(rw, "psync", nj, quick, direct));
            }
            let libaio_jobs = if direct { jobs } else { &[1] };
            for &nj in libaio_jobs {
                fio.push(fio_4k_io(rw, "libaio", nj, quick, direct));
            }
        }
    }
    fio.extend(jobs.iter().map(|&nj| fio_seed000(true, nj, quick)));
    // Issue 11: the same work as root and as uid 65534, on the systems that let that user in.
    let creates = create_workload(if quick { 1000 } else { 10_000 });
    let callers = [
        fio_4k_io("randwrite", "psync", 1, quick, true).by_unprivileged_user(),
        creates.clone(),
        creates.by_unprivileged_user(),
    ];
    let with_callers: Vec<_> = fio.iter().cloned().chain(callers).collect();

    let mut plans = vec![Plan {
        system: SystemSpec::NativeTmpfs,
        workloads: with_callers.clone(),
    }];
    for mode in [Mode::Single, Mode::CloneFd] {
        plans.push(Plan {
            system: SystemSpec::Libfuse {
                example: Example::PassthroughLl,
                mode,
            },
            workloads: fio.clone(),
        });
    }
    let uring = Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH);
    let lanefs = [(true, None), (true, uring), (false, None), (false, uring)].map(
        |(kernel_passthrough, uring_depth)| SystemSpec::LanefsPassthrough {
            queues: ctx.settings.cores,
            parallel_writes: true,
            kernel_passthrough,
            uring_depth,
        },
    );
    for system in passthrough_hp(true).into_iter().chain(lanefs) {
        plans.push(Plan {
            system,
            workloads: with_callers.clone(),
        });
    }
    result.skip(format!(
        "libfuse passthrough_ll: the rows as uid {UNPRIVILEGED_ID} and the creates (it is \
         mounted without allow_other, so only root may use it)"
    ));
    result.note(
        "lanefs passthrough hands opens to the kernel (FUSE passthrough), O_DIRECT ones \
         included, when it runs as root on a kernel that offers it; \"no-passthrough\" is \
         `--no-passthrough`: every byte through the server, direct writes in parallel. \
         libfuse's passthrough_ll runs as shipped (cache=auto, no kernel passthrough). \
         passthrough_hp (libfuse's current source, given with --anchor) runs with `-o \
         io_uring` or `--clone-fd`, and `--nopassthrough` for \"no-passthrough\".",
    );
    result.note(format!(
        "As uid {UNPRIVILEGED_ID}: setpriv --reuid --regid --clear-groups, in a directory that \
         user owns (fio's file laid out by root, then handed over). lanefs acts as each \
         caller; passthrough_hp serves every caller as root and leaves permissions to the \
         kernel (default_permissions)."
    ));
    SuitePlan { result, plans }
}

/// Issue 3's aims: with kernel passthrough, buffered I/O within 10% of native; without it,
/// at least 1.2x passthrough_ll on every row. Issue 4's: io_uring at least matches cloned
/// fds. Issue 12's: with kernel passthrough, direct I/O at least 0.9x native tmpfs and at
/// least passthrough_hp over io_uring, on each transport. Issue 11's rows as another user.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    let kernel_passthrough =
        |r: &Row| r.role == Role::Lanefs && !r.system.ends_with("no-passthrough");
    for (workload, unit) in workloads_of(result) {
        let native = best_median(result, &workload, |r| r.role == Role::Native);
        let passthrough_ll =
            best_median(result, &workload, |r| r.system.contains("passthrough_ll"));
        let with = best_median(result, &workload, kernel_passthrough);
        let without = best_median(result, &workload, |r| {
            r.role == Role::Lanefs && r.system.ends_with("no-passthrough")
        });
        let buffered = workload.contains("buffered");
        if buffered && let (Some(ours), Some(native)) = (&with, &native) {
            lines.extend(aim_line(
                &workload,
                ours,
                native,
                unit,
                0.9,
                ">= 0.9x native",
            ));
        }
        if let (Some(ours), Some(anchor)) = (&without, &passthrough_ll) {
            lines.extend(aim_line(&workload, ours, anchor, unit, 1.2, ">= 1.2x"));
        }
        if !buffered && unit != Unit::SECONDS {
            let hp_uring = best_median(result, &workload, |r| r.system == HP_URING);
            for transport in [true, false] {
                let ours = best_median(result, &workload, |r| {
                    kernel_passthrough(r) && r.system.contains("io_uring") == transport
                });
                if let Some(ours) = &ours {
                    lines.push(aim_line_all(
                        &format!("{workload}, direct"),
                        ours,
                        &[
                            bar("native", native.as_ref(), 0.9),
                            bar(HP_URING, hp_uring.as_ref(), 1.0),
                        ],
                        unit,
                        &format!(">= 0.9x native tmpfs and >= {HP_URING}"),
                    ));
                }
            }
        }
        lines.extend(uring_lines(result, &workload, unit, 1.0, ">= 1x"));
    }
    lines.extend(caller_lines(result));
    result.aims = lines;
}
