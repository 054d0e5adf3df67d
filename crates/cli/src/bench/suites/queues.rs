//! Seed 001: fio 4k seq and rand, read and write, libaio iodepth 16 and psync, numjobs 1 and
//! 4, on null and file backends: lanefs with 1 queue against N queues, and the seed's own
//! system, qemu-storage-daemon's FUSE export, when installed, and passthrough_hp (given by
//! path) as the file backends' strongest anchor.

use super::{SuitePlan, fio_4k, passthrough_hp, volumes};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::SuiteResult;
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::{Mode, SystemSpec};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let cores = ctx.settings.cores;
    let mut result = SuiteResult::new(
        Suite::Queues,
        "Many request queues: 1 queue against one per core",
        "Seed 001: fio 4k seq/rand read/write, libaio (iodepth 16) and psync, numjobs 1 and \
         4, null and file backends; one cloned /dev/fuse queue per server thread.",
    );
    let mut workloads = Vec::new();
    // --quick checks that the suite runs and reports (CI): the random half of the matrix.
    let patterns: &[&str] = if quick {
        &["randread", "randwrite"]
    } else {
        &["read", "randread", "write", "randwrite"]
    };
    for engine in ["libaio", "psync"] {
        for &rw in patterns {
            for nj in [1, 4] {
                workloads.push(fio_4k(rw, engine, nj, quick));
            }
        }
    }
    let mut queue_counts = vec![1, cores];
    queue_counts.dedup();
    let mut plans = vec![
        Plan {
            system: SystemSpec::NativeTmpfs,
            workloads: workloads.clone(),
        },
        Plan {
            system: SystemSpec::Libfuse {
                example: Example::Null,
                mode: Mode::Multi,
            },
            workloads: workloads.clone(),
        },
        Plan {
            system: SystemSpec::Qsd { null: true },
            workloads: workloads.clone(),
        },
        Plan {
            system: SystemSpec::Qsd { null: false },
            workloads: workloads.clone(),
        },
    ];
    for &queues in &queue_counts {
        plans.push(Plan {
            system: SystemSpec::LanefsNull {
                queues,
                parallel_writes: true,
                size: None,
            },
            workloads: workloads.clone(),
        });
    }
    // File backends' strongest anchor.
    for system in passthrough_hp(false) {
        plans.push(Plan {
            system,
            workloads: workloads.clone(),
        });
    }
    for &queues in &queue_counts {
        plans.push(Plan {
            system: SystemSpec::LanefsPassthrough {
                queues,
                parallel_writes: true,
                kernel_passthrough: true,
                uring_depth: None,
            },
            workloads: workloads.clone(),
        });
    }
    for system in volumes(cores) {
        plans.push(Plan {
            system,
            workloads: workloads.clone(),
        });
    }
    result.note(
        "lanefs over FUSE io_uring against cloned fds (the seed's \"cloned fds vs io_uring\" \
         comparison) for null and passthrough: the transport suite; here only the volume runs \
         on both.",
    );
    result.note(
        "Null backends: lanefs null, libfuse's null example (multi-threaded, the anchor that \
         is always there) and qemu-storage-daemon's null-co driver; file backends: lanefs \
         passthrough over tmpfs, lanefs volume (SQLite and blocks on tmpfs), \
         qemu-storage-daemon exporting a raw file on tmpfs and \
         passthrough_hp over tmpfs (io_uring and clone_fd, kernel passthrough on). The \
         best-anchor ratio compares with the best anchor of either kind.",
    );
    SuitePlan { result, plans }
}
