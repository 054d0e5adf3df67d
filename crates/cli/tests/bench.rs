//! `lanefs bench --quick engine`: the suite runs end to end and writes a well-formed report,
//! JSON document and charts, and leaves no mount behind. It checks the output, not speed.

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
            }
        }
    }
    assert!(lanefs_ok >= 8, "too few lanefs rows measured: {rows:?}");
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
