//! Charts, SVG and PNG, one per suite and workload family: median throughput (min..max as a
//! bar) against numjobs per system, or horizontal bars where a family has one job count.
//!
//! Text needs a font file: DejaVu Sans from Debian's fonts-dejavu-core (or
//! $LANEFS_BENCH_FONT). Without one the charts are drawn without text, and the report says so.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench::model::{BenchResults, Status, Unit};
use crate::bench::report::fmt_value;

const SIZE: (u32, u32) = (1000, 600);
const LEGEND_WIDTH: i32 = 240;
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub struct ChartOutput {
    pub files: Vec<String>,
    pub notes: Vec<String>,
}

/// "engine-4k-randread-psync"
pub fn file_stem(suite: &str, family: &str) -> String {
    let mut s = format!("{suite}-");
    let mut dash = false;
    for c in family.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
            dash = false;
        } else if !dash {
            s.push('-');
            dash = true;
        }
    }
    s.trim_end_matches('-').to_owned()
}

/// Registers the font once; None when text can be drawn, else why not.
fn font_problem() -> Option<String> {
    static STATE: OnceLock<Option<String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let path = std::env::var("LANEFS_BENCH_FONT").unwrap_or_else(|_| FONT.to_owned());
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    return Some(format!(
                        "charts have no text: font {path}: {e} (apt-get install fonts-dejavu-core)"
                    ));
                }
            };
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            match plotters::style::register_font("sans-serif", FontStyle::Normal, bytes) {
                Ok(()) => None,
                Err(_) => Some(format!("charts have no text: {path} is not a usable font")),
            }
        })
        .clone()
}

struct Series {
    name: String,
    color: usize,
    /// (index into xs, median, min, max)
    points: Vec<(usize, f64, f64, f64)>,
}

struct ChartData {
    title: String,
    x_desc: &'static str,
    unit: Unit,
    xs: Vec<u32>,
    series: Vec<Series>,
}

fn x_desc(suite: &str) -> &'static str {
    match suite {
        "seek" => "reader threads",
        "dd" => "dd processes",
        _ => "fio numjobs",
    }
}

pub fn write_all(results: &BenchResults, out: &Path) -> ChartOutput {
    let mut output = ChartOutput {
        files: Vec::new(),
        notes: Vec::new(),
    };
    let problem = font_problem();
    let text = problem.is_none();
    if let Some(p) = problem {
        output.notes.push(p);
    }
    for suite in &results.suites {
        let mut systems: Vec<&str> = Vec::new();
        let mut families: Vec<&str> = Vec::new();
        for r in &suite.rows {
            if !systems.contains(&r.system.as_str()) {
                systems.push(&r.system);
            }
            if !families.contains(&r.family.as_str()) {
                families.push(&r.family);
            }
        }
        for family in families {
            let rows: Vec<_> = suite
                .rows
                .iter()
                .filter(|r| r.family == family && r.status == Status::Ok && r.summary.is_some())
                .collect();
            if rows.is_empty() {
                continue;
            }
            let mut xs: Vec<u32> = rows.iter().map(|r| r.numjobs).collect();
            xs.sort_unstable();
            xs.dedup();
            let mut series: Vec<Series> = Vec::new();
            for r in &rows {
                let s = r.summary.expect("filtered");
                let xi = xs.iter().position(|&x| x == r.numjobs).expect("collected");
                let color = systems.iter().position(|&n| n == r.system).unwrap_or(0);
                match series.iter_mut().find(|se| se.name == r.system) {
                    Some(se) => se.points.push((xi, s.median, s.min, s.max)),
                    None => series.push(Series {
                        name: r.system.clone(),
                        color,
                        points: vec![(xi, s.median, s.min, s.max)],
                    }),
                }
            }
            for s in &mut series {
                s.points.sort_by_key(|p| p.0);
            }
            let data = ChartData {
                title: format!("{}: {family}", suite.name),
                x_desc: x_desc(&suite.name),
                unit: rows[0].unit,
                xs,
                series,
            };
            let stem = file_stem(&suite.name, family);
            for ext in ["svg", "png"] {
                let name = format!("{stem}.{ext}");
                let path = out.join(&name);
                let drawn = if ext == "svg" {
                    draw(
                        SVGBackend::new(&path, SIZE).into_drawing_area(),
                        &data,
                        text,
                    )
                } else {
                    draw(
                        BitMapBackend::new(&path, SIZE).into_drawing_area(),
                        &data,
                        text,
                    )
                };
                match drawn {
                    Ok(()) => output.files.push(name),
                    Err(e) => output.notes.push(format!("chart {name}: {e}")),
                }
            }
        }
    }
    output
}

/// The slot an axis position labels: only whole positions do.
fn slot(v: f64) -> Option<usize> {
    let r = v.round();
    ((v - r).abs() < 1e-6 && r >= 0.0).then_some(r as usize)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    data: &ChartData,
    text: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let top = data
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.3.max(p.1)))
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.12 } else { 1.0 };
    let unit = data.unit;
    let y_fmt = move |v: &f64| fmt_value(*v, unit);
    let value_desc = format!(
        "{} ({} is better)",
        unit.name,
        if unit.higher_is_better {
            "higher"
        } else {
            "lower"
        }
    );
    if data.xs.len() == 1 {
        // One job count: a horizontal bar per system.
        let n = data.series.len() as i32;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(16);
        if text {
            builder
                .caption(&data.title, ("sans-serif", 22))
                .x_label_area_size(44)
                .y_label_area_size(260);
        }
        let mut chart = builder
            .build_cartesian_2d(0f64..top, -0.5f64..(n as f64 - 0.5))
            .map_err(err)?;
        if text {
            let names: Vec<String> = data.series.iter().map(|s| s.name.clone()).collect();
            let label = move |v: &f64| {
                slot(*v)
                    .and_then(|i| names.get(i).cloned())
                    .unwrap_or_default()
            };
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_labels(n as usize)
                .y_label_formatter(&label)
                .x_label_formatter(&y_fmt)
                .x_desc(value_desc)
                .label_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
        }
        for (i, s) in data.series.iter().enumerate() {
            let color = Palette99::pick(s.color).to_rgba();
            let (_, median, min, max) = s.points[0];
            let i = i as f64;
            let bar = Rectangle::new([(0.0, i - 0.38), (median, i + 0.38)], color.filled());
            chart.draw_series(std::iter::once(bar)).map_err(err)?;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(min, i), (max, i)],
                    BLACK.stroke_width(2),
                )))
                .map_err(err)?;
        }
    } else {
        let n = data.xs.len() as i32;
        // The legend gets a column of its own, so it never hides a line.
        let (plot, legend) = if text {
            root.split_horizontally(SIZE.0 as i32 - LEGEND_WIDTH)
        } else {
            root.split_horizontally(SIZE.0 as i32)
        };
        let mut builder = ChartBuilder::on(&plot);
        builder.margin(16);
        if text {
            builder
                .caption(&data.title, ("sans-serif", 22))
                .x_label_area_size(48)
                .y_label_area_size(80);
        }
        let mut chart = builder
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(err)?;
        if text {
            let xs = data.xs.clone();
            let label = move |v: &f64| {
                slot(*v)
                    .and_then(|i| xs.get(i))
                    .map(u32::to_string)
                    .unwrap_or_default()
            };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n as usize)
                .x_label_formatter(&label)
                .y_label_formatter(&y_fmt)
                .x_desc(data.x_desc)
                .y_desc(value_desc)
                .label_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
        }
        for s in &data.series {
            let color = Palette99::pick(s.color).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|&(x, m, ..)| (x as f64, m)),
                    color.stroke_width(2),
                ))
                .map_err(err)?;
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|&(x, m, ..)| Circle::new((x as f64, m), 4, color.filled())),
                )
                .map_err(err)?;
            chart
                .draw_series(s.points.iter().map(|&(x, _, lo, hi)| {
                    let x = x as f64;
                    PathElement::new(vec![(x, lo), (x, hi)], color.stroke_width(1))
                }))
                .map_err(err)?;
        }
        if text {
            for (i, s) in data.series.iter().enumerate() {
                let color = Palette99::pick(s.color).to_rgba();
                let y = 60 + 22 * i as i32;
                legend
                    .draw(&PathElement::new(
                        vec![(4, y), (28, y)],
                        color.stroke_width(3),
                    ))
                    .map_err(err)?;
                legend
                    .draw(&Text::new(s.name.clone(), (34, y - 8), ("sans-serif", 14)))
                    .map_err(err)?;
            }
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems() {
        assert_eq!(
            file_stem("engine", "1M randwrite:256 shared file"),
            "engine-1m-randwrite-256-shared-file"
        );
        assert_eq!(file_stem("create", "create"), "create-create");
    }
}
