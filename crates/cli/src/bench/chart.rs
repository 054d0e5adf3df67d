//! Charts, SVG and PNG, one per suite and workload family: median throughput (min..max as a
//! bar) against numjobs per system, or horizontal bars where a family has one job count.
//!
//! Text needs a font file: DejaVu Sans from Debian's fonts-dejavu-core (or
//! $LANEFS_BENCH_FONT). Without one the charts are drawn without text, and the report says so.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
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

/// Series colours, chosen to stay apart from each other (the Okabe-Ito palette, then a few
/// darker tones); plotters' Palette99 put two of our series in nearly one colour.
const COLORS: [RGBColor; 12] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(117, 112, 179),
    RGBColor(166, 86, 40),
    RGBColor(102, 102, 102),
    RGBColor(27, 120, 55),
    RGBColor(178, 24, 43),
];

fn color(index: usize) -> RGBColor {
    COLORS[index % COLORS.len()]
}

/// When the largest value is this many times the smallest, the value axis is logarithmic:
/// otherwise a native series (often 10x a FUSE one) squashes the others against the axis.
const LOG_SCALE_SPREAD: f64 = 8.0;

/// Labels on a linear value axis (a log one has its own ticks: `log_ticks`).
const VALUE_LABELS: usize = 6;

/// The value axis: linear from 0, or logarithmic around the data when it spans decades.
enum ValueAxis {
    Linear { top: f64 },
    Log { bottom: f64, top: f64 },
}

impl ValueAxis {
    fn for_data(data: &ChartData) -> ValueAxis {
        let values = data
            .series
            .iter()
            .flat_map(|s| s.points.iter().flat_map(|p| [p.1, p.2, p.3]));
        let (low, high) = values
            .filter(|v| *v > 0.0)
            .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if high <= 0.0 {
            return ValueAxis::Linear { top: 1.0 };
        }
        if high / low >= LOG_SCALE_SPREAD {
            ValueAxis::Log {
                bottom: low / 1.5,
                top: high * 1.5,
            }
        } else {
            ValueAxis::Linear { top: high * 1.12 }
        }
    }

    /// Where a bar starts: the axis' lowest value.
    fn base(&self) -> f64 {
        match self {
            ValueAxis::Linear { .. } => 0.0,
            ValueAxis::Log { bottom, .. } => *bottom,
        }
    }
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
    let axis = ValueAxis::for_data(data);
    let base = axis.base();
    match (data.xs.len() == 1, axis) {
        (true, ValueAxis::Linear { top }) => draw_bars(&root, data, text, base, false, 0f64..top)?,
        (true, ValueAxis::Log { bottom, top }) => {
            let values = (bottom..top)
                .log_scale()
                .with_key_points(log_ticks(bottom, top));
            draw_bars(&root, data, text, base, true, values)?
        }
        (false, ValueAxis::Linear { top }) => draw_lines(&root, data, text, false, 0f64..top)?,
        (false, ValueAxis::Log { bottom, top }) => {
            let values = (bottom..top)
                .log_scale()
                .with_key_points(log_ticks(bottom, top));
            draw_lines(&root, data, text, true, values)?
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Ticks at 1, 2 and 5 times each power of ten within the range.
fn log_ticks(bottom: f64, top: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(bottom.log10().floor());
    while decade <= top {
        for step in [1.0, 2.0, 5.0] {
            let tick = decade * step;
            if (bottom..=top).contains(&tick) {
                ticks.push(tick);
            }
        }
        decade *= 10.0;
    }
    ticks
}

fn value_desc(data: &ChartData, log: bool) -> String {
    format!(
        "{} ({} is better{})",
        data.unit.name,
        if data.unit.higher_is_better {
            "higher"
        } else {
            "lower"
        },
        if log { "; log scale" } else { "" }
    )
}

/// One job count: a horizontal bar per system (median), with min..max as a line.
fn draw_bars<DB: DrawingBackend, V>(
    root: &DrawingArea<DB, Shift>,
    data: &ChartData,
    text: bool,
    base: f64,
    log: bool,
    values: V,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
    V: AsRangedCoord<Value = f64>,
    V::CoordDescType: ValueFormatter<f64>,
{
    let n = data.series.len() as i32;
    let mut builder = ChartBuilder::on(root);
    builder.margin(16);
    if text {
        builder
            .caption(&data.title, ("sans-serif", 22))
            .x_label_area_size(44)
            .y_label_area_size(260);
    }
    let mut chart = builder
        .build_cartesian_2d(values, -0.5f64..(n as f64 - 0.5))
        .map_err(err)?;
    if text {
        let names: Vec<String> = data.series.iter().map(|s| s.name.clone()).collect();
        let label = move |v: &f64| {
            slot(*v)
                .and_then(|i| names.get(i).cloned())
                .unwrap_or_default()
        };
        let unit = data.unit;
        let value_fmt = move |v: &f64| fmt_value(*v, unit);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n as usize)
            .y_label_formatter(&label)
            .x_labels(VALUE_LABELS)
            .x_label_formatter(&value_fmt)
            .x_desc(value_desc(data, log))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
    }
    for (i, s) in data.series.iter().enumerate() {
        let color = color(s.color);
        let (_, median, min, max) = s.points[0];
        let i = i as f64;
        let bar = Rectangle::new([(base, i - 0.38), (median, i + 0.38)], color.filled());
        chart.draw_series(std::iter::once(bar)).map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(min, i), (max, i)],
                BLACK.stroke_width(2),
            )))
            .map_err(err)?;
    }
    Ok(())
}

/// Several job counts: a line per system through its medians, min..max as whiskers, and the
/// legend in a column of its own so it never hides a line.
fn draw_lines<DB: DrawingBackend, V>(
    root: &DrawingArea<DB, Shift>,
    data: &ChartData,
    text: bool,
    log: bool,
    values: V,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
    V: AsRangedCoord<Value = f64>,
    V::CoordDescType: ValueFormatter<f64>,
{
    let n = data.xs.len() as i32;
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
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), values)
        .map_err(err)?;
    if text {
        let xs = data.xs.clone();
        let label = move |v: &f64| {
            slot(*v)
                .and_then(|i| xs.get(i))
                .map(u32::to_string)
                .unwrap_or_default()
        };
        let unit = data.unit;
        let value_fmt = move |v: &f64| fmt_value(*v, unit);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n as usize)
            .x_label_formatter(&label)
            .y_labels(VALUE_LABELS)
            .y_label_formatter(&value_fmt)
            .x_desc(data.x_desc)
            .y_desc(value_desc(data, log))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
    }
    for s in &data.series {
        let color = color(s.color);
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
            let color = color(s.color);
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(points: &[(&str, &[f64])]) -> ChartData {
        ChartData {
            title: "t".into(),
            x_desc: "fio numjobs",
            unit: Unit::IOPS,
            xs: (1..=points[0].1.len() as u32).collect(),
            series: points
                .iter()
                .enumerate()
                .map(|(i, (name, medians))| Series {
                    name: name.to_string(),
                    color: i,
                    points: medians
                        .iter()
                        .enumerate()
                        .map(|(x, &m)| (x, m, m * 0.9, m * 1.1))
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_series_ten_times_the_others_gets_a_log_axis() {
        let spread = data(&[("native", &[600e3, 1200e3]), ("lanefs", &[60e3, 110e3])]);
        assert!(matches!(
            ValueAxis::for_data(&spread),
            ValueAxis::Log { .. }
        ));
        let close = data(&[("a", &[100.0, 150.0]), ("b", &[120.0, 160.0])]);
        assert!(matches!(
            ValueAxis::for_data(&close),
            ValueAxis::Linear { .. }
        ));
        assert_eq!(log_ticks(40e3, 1.8e6), [50e3, 100e3, 200e3, 500e3, 1e6]);
        // Both kinds of chart draw with both axes (with text when the font is there).
        let text = font_problem().is_none();
        let dir = std::env::temp_dir().join(format!("lanefs-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, d) in [spread, close].iter().enumerate() {
            let path = dir.join(format!("lines-{i}.svg"));
            draw(SVGBackend::new(&path, SIZE).into_drawing_area(), d, text).unwrap();
            let path = dir.join(format!("lines-{i}.png"));
            draw(BitMapBackend::new(&path, SIZE).into_drawing_area(), d, text).unwrap();
            let one = ChartData {
                xs: vec![1],
                series: d
                    .series
                    .iter()
                    .map(|s| Series {
                        name: s.name.clone(),
                        color: s.color,
                        points: vec![s.points[0]],
                    })
                    .collect(),
                ..data(&[("x", &[1.0])])
            };
            let path = dir.join(format!("bars-{i}.png"));
            draw(
                BitMapBackend::new(&path, SIZE).into_drawing_area(),
                &one,
                text,
            )
            .unwrap();
        }
        // LANEFS_KEEP_TEST_CHARTS=1 keeps them, to look at.
        if std::env::var_os("LANEFS_KEEP_TEST_CHARTS").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn series_colours_are_far_apart() {
        let distance = |a: RGBColor, b: RGBColor| {
            let d = |x: u8, y: u8| (x as f64 - y as f64).powi(2);
            (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt()
        };
        for (i, &a) in COLORS.iter().enumerate() {
            for &b in &COLORS[i + 1..] {
                assert!(distance(a, b) > 60.0, "{a:?} and {b:?} look alike");
            }
        }
    }

    #[test]
    fn stems() {
        assert_eq!(
            file_stem("engine", "1M randwrite:256 shared file"),
            "engine-1m-randwrite-256-shared-file"
        );
        assert_eq!(file_stem("create", "create"), "create-create");
    }
}
