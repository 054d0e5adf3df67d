//! fio jobs: their command lines and their JSON reports (`--output-format=json`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

/// One fio job: the seeds ran all of theirs with direct I/O; buffered jobs measure the page
/// cache path (and kernel passthrough, which serves only opens without O_DIRECT).
#[derive(Serialize, Clone, Debug)]
pub struct FioJob {
    /// fio's rw=, e.g. "randread", "write", "randwrite:256".
    pub rw: String,
    pub bs: String,
    pub ioengine: String,
    pub iodepth: u32,
    pub numjobs: u32,
    /// O_DIRECT (fio's direct=1).
    pub direct: bool,
    /// All jobs on one file; else a file per job (needs a directory).
    pub shared_file: bool,
    /// Per file, for targets whose files fio lays out (directories).
    pub size: String,
    /// Cap on the region used of a file that is already there (null's `data`).
    pub region: String,
}

impl FioJob {
    pub fn writes(&self) -> bool {
        self.rw.contains("write")
    }

    /// The arguments for one run on `place` (a file it must use, or a directory).
    pub fn args(&self, file: Option<&Path>, dir: Option<&Path>, runtime: Duration) -> Vec<String> {
        let ms = runtime.as_millis().max(50);
        let mut args = vec![
            "--name=lanefs-bench".to_owned(),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--ioengine={}", self.ioengine),
            format!("--iodepth={}", self.iodepth),
            format!("--numjobs={}", self.numjobs),
            format!("--direct={}", u8::from(self.direct)),
            "--group_reporting=1".into(),
            "--time_based=1".into(),
            format!("--runtime={ms}ms"),
            "--fallocate=none".into(),
            "--output-format=json".into(),
        ];
        if self.rw.contains(':') {
            // The seed's "randwrite:256" with rw_sequencer=sequential.
            args.push("--rw_sequencer=sequential".into());
        }
        match (file, dir) {
            (Some(file), _) => {
                args.push(format!("--filename={}", fio_escape(file)));
                args.push(format!("--size={}", self.region));
            }
            (None, Some(dir)) => {
                args.push(format!("--directory={}", fio_escape(dir)));
                if self.shared_file {
                    args.push(format!("--filename=fio-shared-{}", self.bs));
                } else {
                    args.push(format!("--filename_format=fio-job{}.$jobnum", self.bs));
                }
                args.push(format!("--size={}", self.size));
            }
            (None, None) => {}
        }
        args
    }

    pub fn config(&self) -> Value {
        json!(self)
    }
}

/// fio treats ':' in file names as a separator.
fn fio_escape(path: &Path) -> String {
    path.display().to_string().replace(':', "\\:")
}

/// The numbers the bench keeps from one fio report (group_reporting: one job entry).
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct FioResult {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bw_bytes: f64,
    pub write_bw_bytes: f64,
    pub read_lat_mean_ns: f64,
    pub write_lat_mean_ns: f64,
    pub read_clat_p99_ns: f64,
    pub write_clat_p99_ns: f64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub runtime_ms: u64,
    pub jobs: u64,
}

impl FioResult {
    pub fn iops(&self) -> f64 {
        self.read_iops + self.write_iops
    }

    pub fn mib_per_s(&self) -> f64 {
        (self.read_bw_bytes + self.write_bw_bytes) / (1024.0 * 1024.0)
    }
}

/// Parses fio's JSON output (anything printed before the document is skipped).
pub fn parse(stdout: &str) -> Result<FioResult, String> {
    let start = stdout
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| stdout.starts_with('{').then_some(0))
        .ok_or_else(|| format!("no JSON in fio's output: {}", tail(stdout, 300)))?;
    let doc: Value = serde_json::from_str(&stdout[start..])
        .or_else(|_| {
            // Trailing text after the document (fio can print errors after it).
            let mut de = serde_json::Deserializer::from_str(&stdout[start..]).into_iter::<Value>();
            de.next().unwrap_or(Ok(Value::Null))
        })
        .map_err(|e| format!("fio's JSON: {e}"))?;
    let jobs = doc["jobs"]
        .as_array()
        .ok_or("fio's JSON has no jobs array")?;
    let first = jobs.first().ok_or("fio's JSON has no job")?;
    let mut result = FioResult {
        jobs: jobs.len() as u64,
        ..FioResult::default()
    };
    for job in jobs {
        let error = job["error"].as_i64().unwrap_or(0);
        if error != 0 {
            return Err(format!(
                "fio job failed: error {error} ({})",
                std::io::Error::from_raw_os_error(error as i32)
            ));
        }
        let num = |v: &Value| v.as_f64().unwrap_or(0.0);
        result.read_iops += num(&job["read"]["iops"]);
        result.write_iops += num(&job["write"]["iops"]);
        result.read_bw_bytes += num(&job["read"]["bw_bytes"]);
        result.write_bw_bytes += num(&job["write"]["bw_bytes"]);
        result.read_ios += job["read"]["total_ios"].as_u64().unwrap_or(0);
        result.write_ios += job["write"]["total_ios"].as_u64().unwrap_or(0);
    }
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    result.read_lat_mean_ns = num(&first["read"]["lat_ns"]["mean"]);
    result.write_lat_mean_ns = num(&first["write"]["lat_ns"]["mean"]);
    result.read_clat_p99_ns = num(&first["read"]["clat_ns"]["percentile"]["99.000000"]);
    result.write_clat_p99_ns = num(&first["write"]["clat_ns"]["percentile"]["99.000000"]);
    result.runtime_ms = first["job_runtime"]
        .as_u64()
        .or_else(|| first["read"]["runtime"].as_u64())
        .unwrap_or(0);
    if result.read_ios + result.write_ios == 0 {
        return Err("fio completed no I/O".into());
    }
    Ok(result)
}

fn tail(text: &str, max: usize) -> String {
    let t = text.trim();
    let start = t.len().saturating_sub(max);
    let start = (start..t.len())
        .find(|&i| t.is_char_boundary(i))
        .unwrap_or(t.len());
    t[start..].replace('\n', " / ")
}

/// Finds fio: `--fio PATH`, else $LANEFS_FIO, else `fio` in PATH. Returns its path and
/// version, or why there is none.
pub fn locate(explicit: Option<&Path>) -> Result<(PathBuf, String), String> {
    let candidate = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("LANEFS_FIO").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("fio"));
    let out = Command::new(&candidate)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "fio not found ({}: {e}); install it (apt-get install fio) or pass --fio PATH / LANEFS_FIO",
                candidate.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!("{} --version failed", candidate.display()));
    }
    Ok((
        candidate,
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"fio: something to say first
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "lanefs-bench",
      "error" : 0,
      "job_runtime" : 2000,
      "read" : {
        "io_bytes" : 409600, "bw_bytes" : 204800000, "iops" : 50000.5, "runtime" : 2000,
        "total_ios" : 100001,
        "clat_ns" : { "mean" : 15000.0, "percentile" : { "50.000000" : 14000, "99.000000" : 30208 } },
        "lat_ns" : { "min" : 1, "max" : 9, "mean" : 19000.25 }
      },
      "write" : {
        "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.000000, "runtime" : 0, "total_ios" : 0,
        "clat_ns" : { "mean" : 0.0 }, "lat_ns" : { "mean" : 0.0 }
      }
    }
  ]
}
"#;

    #[test]
    fn parses_a_group_report() {
        let r = parse(REPORT).unwrap();
        assert_eq!(r.read_iops, 50000.5);
        assert_eq!(r.iops(), 50000.5);
        assert_eq!(r.read_ios, 100001);
        assert_eq!(r.read_lat_mean_ns, 19000.25);
        assert_eq!(r.read_clat_p99_ns, 30208.0);
        assert_eq!(r.runtime_ms, 2000);
        assert!((r.mib_per_s() - 204800000.0 / 1048576.0).abs() < 1e-9);
    }

    #[test]
    fn rejects_errors_and_empty_runs() {
        let failed = REPORT.replace("\"error\" : 0", "\"error\" : 24");
        let e = parse(&failed).unwrap_err();
        assert!(e.contains("error 24"), "{e}");
        let idle = REPORT.replace("\"total_ios\" : 100001", "\"total_ios\" : 0");
        assert_eq!(parse(&idle).unwrap_err(), "fio completed no I/O");
        assert!(parse("fio: no such file").unwrap_err().contains("no JSON"));
        assert!(parse("{\"x\": 1}").unwrap_err().contains("no jobs"));
    }

    #[test]
    fn parses_with_trailing_text() {
        let r = parse(&format!("{REPORT}fio: pid 1 exited\n")).unwrap();
        assert_eq!(r.read_ios, 100001);
    }

    #[test]
    fn job_arguments() {
        let job = FioJob {
            rw: "randwrite:256".into(),
            bs: "1M".into(),
            ioengine: "psync".into(),
            iodepth: 1,
            numjobs: 2,
            direct: true,
            shared_file: true,
            size: "1G".into(),
            region: "4G".into(),
        };
        let a = job.args(Some(Path::new("/m/a:b")), None, Duration::from_millis(1500));
        assert!(a.contains(&"--direct=1".to_owned()));
        assert!(a.contains(&"--rw=randwrite:256".to_owned()));
        assert!(a.contains(&"--rw_sequencer=sequential".to_owned()));
        assert!(a.contains(&"--runtime=1500ms".to_owned()));
        assert!(a.contains(&"--filename=/m/a\\:b".to_owned()));
        assert!(a.contains(&"--size=4G".to_owned()));
        let a = FioJob {
            shared_file: false,
            direct: false,
            ..job
        }
        .args(None, Some(Path::new("/d")), Duration::from_secs(1));
        assert!(a.contains(&"--directory=/d".to_owned()));
        assert!(a.contains(&"--direct=0".to_owned()));
        assert!(a.contains(&"--filename_format=fio-job1M.$jobnum".to_owned()));
        assert!(a.contains(&"--size=1G".to_owned()));
    }
}
