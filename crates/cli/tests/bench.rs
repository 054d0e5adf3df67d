//! `lanefs bench --quick`: suites run end to end and write a well-formed report, JSON
//! document and charts, with each server's CPU per operation, and leave no mount behind;
//! anchors given by path are skipped with a note when they cannot run, and an unknown one is
//! refused. It checks the output, not speed.

mod common;

use std::process::Command;

use common::{TempDir, lanefs};

#[test]
fn quick_engine_suite_writes_report_json_and_charts() {
    let out = TempDir::new("bench");
    let child = Command::new(lanefs())
        .args([
            "bench",
            "--quick",
            "engine",
            "--runtime",
            "0.25",
            "--no-print",
            "--out",
        ])
        .arg(out.path())
        .spawn()
        .expect("running lanefs bench");
    let pid = child.id();
    let status = child
        .wait_with_output()
        .expect("waiting for lanefs bench")
        .status;
    assert!(status.success(), "lanefs bench failed: {status}");

    // Nothing the bench mounted is left (its scratch dir is named after its pid).
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let scratch = format!("lanefs-bench-{pid}");
    assert!(
        !mountinfo.contains(&scratch),
        "lanefs bench left mounts behind:\n{mountinfo}"
    );
    assert!(!std::env::temp_dir().join(&scratch).exists());

    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.starts_with("# lanefs bench"), "{report}");
    assert!(report.contains("## engine"), "{report}");
    assert!(report.contains("| **lanefs null 1q** |"), "{report}");
    assert!(
        report.contains("| server CPU s | ops/CPU-s | x hp CPU |"),
        "{report}"
    );

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("results.json parses");
    let machine = &json["machine"];
    assert!(!machine["kernel"].as_str().unwrap().is_empty());
    assert!(!machine["cpu_model"].as_str().unwrap().is_empty());
    assert!(machine["cores"].as_u64().unwrap() > 0);
    assert!(machine["memory_bytes"].as_u64().unwrap() > 0);
    assert!(!json["lanefs"]["revision"].as_str().unwrap().is_empty());
    assert_eq!(json["settings"]["quick"], true);
    assert_eq!(json["schema"], 2);
    let suites = json["suites"].as_array().unwrap();
    assert_eq!(suites.len(), 1);
    assert_eq!(suites[0]["name"], "engine");
    let rows = suites[0]["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let mut lanefs_ok = 0;
    for row in rows {
        for field in [
            "workload", "family", "system", "role", "unit", "status", "runs",
        ] {
            assert!(!row[field].is_null(), "row without {field}: {row}");
        }
        if row["status"]["state"] == "ok" {
            let median = row["summary"]["median"].as_f64().unwrap();
            assert!(median > 0.0, "{row}");
            for run in row["runs"].as_array().unwrap() {
                assert!(run["value"].as_f64().unwrap() > 0.0, "{row}");
            }
            if row["role"] == "lanefs" {
                lanefs_ok += 1;
                assert!(row["system_config"]["queues"].as_u64().unwrap() >= 1);
                // The null daemon serves every request: its CPU per run and fio's I/Os.
                let cpu = &row["server_cpu"];
                assert!(cpu["cpu_s"].as_f64().unwrap() >= 0.0, "{row}");
                assert!(cpu["ops"].as_f64().unwrap() >= 1.0, "{row}");
                let work = &row["runs"][0]["work"];
                assert!(work["ops"].as_f64().unwrap() >= 1.0, "{row}");
                assert!(work["server_cpu_s"].as_f64().is_some(), "{row}");
            }
            if row["role"] == "native" {
                assert!(
                    row["server_cpu"].is_null(),
                    "a native row has no server: {row}"
                );
            }
        }
    }
    assert!(lanefs_ok >= 8, "too few lanefs rows measured: {rows:?}");
    assert!(
        rows.iter()
            .any(|r| r["role"] == "lanefs" && r["server_cpu"]["ops_per_cpu_s"].as_f64() > Some(0.0)),
        "no lanefs row shows operations per CPU-second: {rows:?}"
    );
    // The 4k rows of lanefs and the native rows are there for every workload.
    for w in [
        "4k randread psync, 1 job",
        "4k randwrite psync, 2 jobs",
        "4k randread libaio qd16, 1 job",
        "1M randwrite:256 shared file, 2 jobs",
    ] {
        assert!(
            rows.iter()
                .any(|r| r["workload"] == w && r["system"] == "lanefs null 1q"),
            "no {w} row"
        );
    }

    let svgs: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(!svgs.is_empty(), "no SVG chart written");
    let svg = std::fs::read_to_string(svgs[0].path()).unwrap();
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        json["charts"].as_array().unwrap().len() % 2,
        0,
        "each chart as SVG and PNG"
    );
}

/// One run of the create suite (minutes) checks both: anchors given by path that cannot run,
/// and the volume's rows on the PostgreSQL (and the MinIO) the bench starts and stops itself.
#[test]
fn quick_create_skips_anchors_that_cannot_run_and_measures_the_volume_on_postgres() {
    let out = TempDir::new("bench-anchors");
    let child = Command::new(lanefs())
        .args(["bench", "--quick", "create", "--no-print"])
        .args(["--anchor", "passthrough_hp=/nonexistent/passthrough_hp"])
        .args(["--anchor", "juicefs=/nonexistent/juicefs"])
        .arg("--out")
        .arg(out.path())
        .spawn()
        .expect("running lanefs bench");
    let pid = child.id();
    let status = child
        .wait_with_output()
        .expect("waiting for lanefs bench")
        .status;
    assert!(status.success(), "lanefs bench failed: {status}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("results.json parses");
    assert_eq!(
        json["tools"]["anchors_by_path"]["passthrough_hp"],
        "/nonexistent/passthrough_hp"
    );
    let suite = &json["suites"][0];
    let skipped: Vec<&str> = suite["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    for system in ["passthrough_hp io_uring", "passthrough_hp clone-fd"] {
        assert!(
            skipped.iter().any(|s| s.starts_with(system)
                && s.contains("--anchor passthrough_hp=/nonexistent/passthrough_hp")),
            "{system} not skipped with its path: {skipped:?}"
        );
    }
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("JuiceFS") && s.contains("/nonexistent/juicefs")),
        "{skipped:?}"
    );
    let rows = suite["rows"].as_array().unwrap();
    assert!(
        !rows.iter().any(|r| r["system"]
            .as_str()
            .is_some_and(|s| s.contains("passthrough_hp") || s.contains("JuiceFS"))),
        "a skipped anchor has rows: {rows:?}"
    );
    // The creates count their files as the work the daemon's CPU time is set against.
    let lanefs = rows
        .iter()
        .find(|r| r["role"] == "lanefs" && r["status"]["state"] == "ok")
        .expect("a lanefs row");
    assert_eq!(lanefs["server_cpu"]["ops"], 1000.0, "{lanefs}");

    // The volume on PostgreSQL: its rows measured, or skipped with a note where PostgreSQL is
    // not installed.
    let on_postgres = |r: &&serde_json::Value| {
        r["system"]
            .as_str()
            .is_some_and(|s| s.starts_with("lanefs volume on PostgreSQL"))
    };
    if skipped
        .iter()
        .any(|s| s.contains("PostgreSQL is not installed"))
    {
        eprintln!("skipped: the PostgreSQL rows (PostgreSQL is not installed)");
        assert!(!rows.iter().any(|r| on_postgres(&r)), "{rows:?}");
        return;
    }
    let pg_rows: Vec<_> = rows.iter().filter(on_postgres).collect();
    for r in &pg_rows {
        assert_eq!(r["status"]["state"], "ok", "{r}");
        assert_eq!(r["system_config"]["metadata"], "PostgreSQL", "{r}");
        assert!(r["summary"]["median"].as_f64().unwrap() > 0.0, "{r}");
    }
    // The creates are then listed with `ls -l`, a row of their own.
    assert!(
        pg_rows
            .iter()
            .any(|r| r["workload"] == "ls -l of the 1000 files"),
        "no ls -l row on PostgreSQL: {pg_rows:?}"
    );
    // Synchronous commits over both transports, and --async-commit (io_uring rows are
    // skipped with a note where the kernel has io_uring off).
    for (transport, async_commit) in [
        ("/dev/fuse", false),
        ("io_uring", false),
        ("io_uring", true),
    ] {
        let measured = pg_rows.iter().any(|r| {
            r["workload"] == "1000 x echo foobarbaz > $i"
                && r["system_config"]["transport"] == transport
                && r["system_config"]["async_commit"] == async_commit
        });
        let uring_off = transport == "io_uring"
            && skipped
                .iter()
                .any(|s| s.starts_with("lanefs volume on PostgreSQL io_uring"));
        assert!(
            measured || uring_off,
            "no create row on PostgreSQL over {transport} (async commit {async_commit}): {pg_rows:?}"
        );
    }
    // Two mounts of one volume: one creating alone and both at once, with the ratio.
    for by in ["1 mount", "2 mounts at once"] {
        let workload = format!("creates in one directory by {by}, 300 files each");
        let row = pg_rows
            .iter()
            .find(|r| r["workload"] == workload.as_str())
            .unwrap_or_else(|| panic!("no row {workload}: {pg_rows:?}"));
        assert_eq!(row["unit"]["name"], "creates/s", "{row}");
        assert_eq!(row["system_config"]["mounts"], 2, "{row}");
    }
    let aims: Vec<&str> = suite["aims"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        aims.iter().any(
            |a| a.contains("creates in one directory: 2 mounts at once (")
                && a.contains("aim >= 1.5x")
        ),
        "no two-mount ratio: {aims:?}"
    );
    // The volume on PostgreSQL + S3 (the MinIO the bench starts itself) over io_uring:
    // measured, or skipped with a note where MinIO is not installed or io_uring is off.
    let s3_system = "lanefs volume on PostgreSQL + S3 io_uring";
    let s3_skip = skipped.iter().find(|s| s.starts_with(s3_system));
    match s3_skip {
        Some(why) => {
            eprintln!("skipped: the PostgreSQL + S3 row ({why})");
            assert!(
                why.contains("MinIO is not installed") || why.contains("io_uring"),
                "{why}"
            );
        }
        None => {
            let row = pg_rows
                .iter()
                .find(|r| {
                    r["workload"] == "1000 x echo foobarbaz > $i"
                        && r["system"]
                            .as_str()
                            .is_some_and(|s| s.starts_with(s3_system))
                })
                .unwrap_or_else(|| panic!("no create row on PostgreSQL + S3: {pg_rows:?}"));
            assert_eq!(row["system_config"]["data"], "S3 (MinIO)", "{row}");
            assert_eq!(row["system_config"]["transport"], "io_uring", "{row}");
            let notes = json["notes"].as_array().unwrap();
            assert!(
                notes.iter().any(|n| n
                    .as_str()
                    .is_some_and(|n| n.starts_with("MinIO") && n.contains("started by the bench"))),
                "no note on the bench's MinIO: {notes:?}"
            );
        }
    }
    // The servers the bench started (PostgreSQL, MinIO) are gone with its scratch directory.
    let scratch = format!("lanefs-bench-{pid}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&scratch))
        .collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert!(!std::env::temp_dir().join(&scratch).exists());
}

#[test]
fn an_unknown_anchor_is_refused_before_anything_runs() {
    let out = TempDir::new("bench-unknown-anchor");
    let dir = out.path().join("report");
    let done = Command::new(lanefs())
        .args([
            "bench",
            "--quick",
            "engine",
            "--anchor",
            "passthrough_ll=/bin/true",
        ])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("running lanefs bench");
    assert!(!done.status.success());
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        stderr.contains("no anchor is called \"passthrough_ll\" (known: passthrough_hp, juicefs)"),
        "{stderr}"
    );
    assert!(!dir.exists(), "it wrote output before refusing");
}
