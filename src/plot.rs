//! `lethe plot RUN [RUN...]`: the training and validation curves of several runs on one
//! figure, drawn by the `plotters` crate as PNG and SVG. Each run has a colour; its
//! training curve is a line, its validation curve a line with dots. The y axis is a
//! field of `metrics.jsonl` (`loss` by default; `bpb`, `accuracy`, `ppl`, ...).

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{LetheError, Result};

/// One run's points of the metric: `(step, value)` per split.
#[derive(Clone, Debug, PartialEq)]
pub struct Curves {
    /// The run's name (its folder's).
    pub name: String,
    /// Training points.
    pub train: Vec<(f64, f64)>,
    /// Validation points.
    pub valid: Vec<(f64, f64)>,
}

/// The points of `metric` in the run folder `dir`'s `metrics.jsonl`. Records without a
/// number there (`null`: no scored token) are skipped.
pub fn read_curves(dir: &Path, metric: &str) -> Result<Curves> {
    let path = dir.join("metrics.jsonl");
    let text = crate::input::read_to_string(&path)
        .map_err(|e| LetheError::Data { path: path.clone(), reason: format!("the run's metrics: {e}") })?;
    let mut curves = Curves {
        name: dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
        train: vec![],
        valid: vec![],
    };
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(step), Some(value)) = (record["step"].as_f64(), record[metric].as_f64()) else { continue };
        match record["split"].as_str() {
            Some("train") => curves.train.push((step, value)),
            Some("valid") => curves.valid.push((step, value)),
            _ => {}
        }
    }
    if curves.train.is_empty() && curves.valid.is_empty() {
        return Err(LetheError::Data {
            path,
            reason: format!(
                "holds no `{metric}` to plot (fields: loss, bpb, ppl, accuracy, lr, grad_norm, tokens_per_s, ...)"
            ),
        });
    }
    Ok(curves)
}

/// Draws `runs` on one chart of `metric` against the step, into `<out>.png` and
/// `<out>.svg`; returns the two paths.
pub fn plot(runs: &[Curves], metric: &str, out: &Path) -> Result<[PathBuf; 2]> {
    let ((x0, x1), (y0, y1)) = bounds(runs);
    if ![x0, x1, y0, y1, x1 - x0, y1 - y0].iter().all(|v| v.is_finite()) {
        let values = runs.iter().flat_map(|r| r.train.iter().chain(&r.valid)).map(|p| p.1);
        let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
        return Err(LetheError::Invalid(format!(
            "`{metric}` runs from {low:e} to {high:e}: a range that large cannot be drawn; plot another metric"
        )));
    }
    let png = out.with_extension("png");
    let svg = out.with_extension("svg");
    let size = (960, 600);
    write_png(&png, |tmp| {
        draw(&BitMapBackend::new(tmp, size).into_drawing_area(), runs, metric).map_err(|e| e.to_string())
    })?;
    let mut text = String::new();
    draw(&SVGBackend::with_string(&mut text, size).into_drawing_area(), runs, metric)
        .map_err(|e| LetheError::Invalid(format!("drawing `{}`: {e}", svg.display())))?;
    crate::checkpoint::write_atomic(&svg, text.as_bytes())?;
    Ok([png, svg])
}

/// Draws a PNG by `draw` into a temporary file beside `path`, then renames it: a failed
/// drawing leaves no half-written picture.
fn write_png(path: &Path, draw: impl FnOnce(&Path) -> std::result::Result<(), String>) -> Result<()> {
    let tmp = path.with_extension("tmp.png");
    // The file first: a folder that cannot be written is said as the system says it,
    // not as the drawing library's nested error values.
    std::fs::File::create(&tmp).map_err(|e| LetheError::io(&tmp, e))?;
    if let Err(e) = draw(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(LetheError::Invalid(format!("drawing `{}`: {e}", path.display())));
    }
    std::fs::rename(&tmp, path).map_err(|e| LetheError::io(path, e))
}

/// The largest PNG drawn from an SVG, in pixels: a longer picture is scaled down to fit
/// (16M pixels are 64 MB of RGBA while drawing).
const MAX_PNG_PIXELS: f32 = 16.0e6;

/// Writes the SVG text `svg` to `path` and the same picture as PNG beside it (`.png`),
/// drawn by `resvg` at twice the SVG's size (less when that exceeds 16M pixels). The PNG is
/// drawn before either file is written, so a picture that cannot be drawn leaves neither.
/// Returns the PNG's path.
pub fn write_svg_and_png(path: &Path, svg: &str) -> Result<PathBuf> {
    let png_path = path.with_extension("png");
    let png = svg_to_png(svg).map_err(|e| LetheError::Invalid(format!("drawing `{}`: {e}", png_path.display())))?;
    crate::checkpoint::write_atomic(path, svg.as_bytes())?;
    crate::checkpoint::write_atomic(&png_path, &png)?;
    Ok(png_path)
}

/// Rasterises an SVG text to PNG bytes.
pub fn svg_to_png(svg: &str) -> std::result::Result<Vec<u8>, String> {
    use resvg::{tiny_skia, usvg};
    let options = usvg::Options { fontdb: fonts(), ..usvg::Options::default() };
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| e.to_string())?;
    let size = tree.size();
    let scale = 2.0f32.min((MAX_PNG_PIXELS / (size.width() * size.height()).max(1.0)).sqrt());
    let (w, h) = (((size.width() * scale).ceil() as u32).max(1), ((size.height() * scale).ceil() as u32).max(1));
    let mut pixmap =
        tiny_skia::Pixmap::new(w, h).ok_or_else(|| format!("a picture of {w} x {h} pixels cannot be allocated"))?;
    resvg::render(&tree, tiny_skia::Transform::from_scale(scale, scale), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| e.to_string())
}

/// The system's fonts, read once, with the generic families (`sans-serif`, `monospace`,
/// `serif`) set to the first common family installed: fontdb's defaults (Arial, Courier
/// New, Times New Roman) are rarely on Linux.
fn fonts() -> std::sync::Arc<resvg::usvg::fontdb::Database> {
    static FONTS: std::sync::OnceLock<std::sync::Arc<resvg::usvg::fontdb::Database>> = std::sync::OnceLock::new();
    FONTS
        .get_or_init(|| {
            let mut db = resvg::usvg::fontdb::Database::new();
            db.load_system_fonts();
            let installed = |names: &[&str]| {
                names
                    .iter()
                    .find(|n| db.faces().any(|f| f.families.iter().any(|(name, _)| name == *n)))
                    .map(|n| n.to_string())
            };
            let sans = installed(&["DejaVu Sans", "Liberation Sans", "Noto Sans", "Arial", "Helvetica"]);
            let mono = installed(&["DejaVu Sans Mono", "Liberation Mono", "Noto Sans Mono", "Courier New"]);
            let serif = installed(&["DejaVu Serif", "Liberation Serif", "Noto Serif", "Times New Roman"]);
            if let Some(f) = sans {
                db.set_sans_serif_family(f);
            }
            if let Some(f) = mono {
                db.set_monospace_family(f);
            }
            if let Some(f) = serif {
                db.set_serif_family(f);
            }
            std::sync::Arc::new(db)
        })
        .clone()
}

/// The colours of [`colour`]'s palette.
const PALETTE_LEN: usize = 8;

/// The colour of the `i`-th run (a qualitative palette that prints and reads apart).
pub fn colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; PALETTE_LEN] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    PALETTE[i % PALETTE.len()]
}

/// The range of every point, widened a little so no point sits on the frame.
fn bounds(runs: &[Curves]) -> ((f64, f64), (f64, f64)) {
    let points = runs.iter().flat_map(|r| r.train.iter().chain(&r.valid));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    ((x0.min(x1), x1.max(x0 + 1.0)), (y0 - pad, y1 + pad))
}

fn draw<B: DrawingBackend>(
    area: &DrawingArea<B, Shift>,
    runs: &[Curves],
    metric: &str,
) -> std::result::Result<(), DrawingAreaErrorKind<B::ErrorType>> {
    area.fill(&WHITE)?;
    let ((x0, x1), (y0, y1)) = bounds(runs);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{metric} against training step (line: train, dots: valid)"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(metric)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, run) in runs.iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(run.train.iter().copied(), c.stroke_width(2)))?
            .label(format!("{} (train)", run.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        if !run.valid.is_empty() {
            chart.draw_series(LineSeries::new(run.valid.iter().copied(), c.mix(0.5).stroke_width(1)))?;
            chart
                .draw_series(run.valid.iter().map(|&p| Circle::new(p, 5, c.filled())))?
                .label(format!("{} (valid)", run.name))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    area.present()
}

/// One mechanism of a sweep chart: its runs as dots, and a line through its means.
#[derive(Clone, Debug)]
pub struct SweepSeries {
    /// The legend's name.
    pub name: String,
    /// Its colour.
    pub colour: RGBColor,
    /// Each run: `(memory size, quality)`.
    pub points: Vec<(f64, f64)>,
    /// The mean per size, in order of size.
    pub means: Vec<(f64, f64)>,
}

/// A sweep's chart: quality (`y_label`) against a size (`x_label`: the average memory
/// size of a sweep, the length of a long-context evaluation), on a log scale when the
/// sizes span more than 8x; the y axis over `y_range` when given (accuracy's [0, 1]),
/// else over the points. Returns the SVG text and writes the PNG to `png`.
pub fn sweep_chart(
    series: &[SweepSeries],
    (x_label, y_label): (&str, &str),
    y_range: Option<(f64, f64)>,
    png: &Path,
) -> Result<String> {
    let size = (760, 460);
    let mut svg = String::new();
    let labels = (x_label, y_label);
    draw_sweep(&SVGBackend::with_string(&mut svg, size).into_drawing_area(), series, labels, y_range)
        .map_err(|e| LetheError::Invalid(format!("drawing the chart of {y_label}: {e}")))?;
    write_png(png, |tmp| {
        draw_sweep(&BitMapBackend::new(tmp, size).into_drawing_area(), series, labels, y_range)
            .map_err(|e| e.to_string())
    })?;
    Ok(svg)
}

fn draw_sweep<B: DrawingBackend>(
    area: &DrawingArea<B, Shift>,
    series: &[SweepSeries],
    (x_label, y_label): (&str, &str),
    y_range: Option<(f64, f64)>,
) -> std::result::Result<(), DrawingAreaErrorKind<B::ErrorType>> {
    area.fill(&WHITE)?;
    let runs: Vec<Curves> =
        series.iter().map(|s| Curves { name: s.name.clone(), train: s.points.clone(), valid: vec![] }).collect();
    let ((x0, x1), (y0, y1)) = bounds(&runs);
    let (y0, y1) = y_range.unwrap_or((y0, y1));
    // Headroom above the highest point for the legend (about 22 px a line of the 370 px
    // plot), so that it hides no point.
    let legend = ((22 * series.len() + 20) as f64 / 370.0).min(0.6);
    let y1 = y1 + (y1 - y0) * legend / (1.0 - legend);
    let mut builder = ChartBuilder::on(area);
    builder.margin(15).x_label_area_size(45).y_label_area_size(70);
    if x0 > 0.0 && x1 / x0 > 8.0 {
        let (lo, hi) = (x0 / 1.2, x1 * 1.2);
        let mut chart = builder.build_cartesian_2d((lo..hi).log_scale().with_key_points(log_ticks(lo, hi)), y0..y1)?;
        fill_sweep(&mut chart, series, (&format!("{x_label} (log scale)"), y_label), y_range.map(|r| r.1))?;
    } else {
        let pad = ((x1 - x0) * 0.05).max(1e-3);
        let mut chart = builder.build_cartesian_2d((x0 - pad)..(x1 + pad), y0..y1)?;
        fill_sweep(&mut chart, series, (x_label, y_label), y_range.map(|r| r.1))?;
    }
    area.present()
}

/// Ticks of a log axis over `[lo, hi]`: 1, 2 and 5 times the powers of ten.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let first = lo.max(1e-9).log10().floor() as i32;
    let last = hi.max(1e-9).log10().ceil() as i32;
    (first..=last).flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e))).filter(|t| (lo..=hi).contains(t)).collect()
}

/// The mesh, the means' lines, the runs' dots and the legend of a sweep chart on either
/// x scale; no y label above `y_top` (the headroom kept for the legend).
fn fill_sweep<'a, B, X>(
    chart: &mut ChartContext<'a, B, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    series: &[SweepSeries],
    (x_label, y_label): (&str, &str),
    y_top: Option<f64>,
) -> std::result::Result<(), DrawingAreaErrorKind<B::ErrorType>>
where
    B: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let tick = |x: &f64| if x.abs() >= 100.0 || x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.1}") };
    // With a fixed range, the headroom above it (for the legend) has no labels.
    let top = y_top.unwrap_or(f64::INFINITY);
    let y_tick = |y: &f64| if *y > top + 1e-9 { String::new() } else { format!("{y:.1}") };
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(12)
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&tick)
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14));
    if y_top.is_some() {
        mesh.y_label_formatter(&y_tick);
    }
    mesh.draw()?;
    // Past the palette's eight colours the series' dots turn to triangles, so that two
    // series of one colour still read apart.
    for (i, s) in series.iter().enumerate() {
        let c = s.colour;
        chart.draw_series(LineSeries::new(s.means.iter().copied(), c.stroke_width(2)))?;
        let triangles = !(i / PALETTE_LEN).is_multiple_of(2);
        let dots = match triangles {
            false => chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 5, c.filled())))?,
            true => chart.draw_series(s.points.iter().map(|&p| TriangleMarker::new(p, 7, c.filled())))?,
        };
        dots.label(s.name.clone()).legend(move |(x, y)| match triangles {
            true => TriangleMarker::new((x + 10, y), 7, c.filled()).into_dyn(),
            false => Circle::new((x + 10, y), 5, c.filled()).into_dyn(),
        });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// One task's accuracy by length and depth (`lethe longeval`): a cell per length
/// (columns) and depth (rows), coloured from red (0) through yellow to green (1) and
/// labelled with its percentage; a cell without a figure stays grey.
#[derive(Clone, Debug)]
pub struct Heatmap {
    /// The chart's title.
    pub title: String,
    /// The columns' lengths, and their unit (`bytes`, `tokens`).
    pub lengths: (Vec<usize>, String),
    /// The rows' labels (`25%`), top to bottom.
    pub rows: Vec<String>,
    /// `accuracy[row][column]`, in [0, 1].
    pub accuracy: Vec<Vec<Option<f64>>>,
}

/// The SVG text of `map`.
pub fn heatmap(map: &Heatmap) -> Result<String> {
    // Wide enough for the title (about 11 px a character at its size) over few columns.
    let width = (160 + 90 * map.lengths.0.len() as u32).max(40 + 11 * map.title.chars().count() as u32);
    let size = (width, 130 + 44 * map.rows.len() as u32);
    let mut svg = String::new();
    draw_heatmap(&SVGBackend::with_string(&mut svg, size).into_drawing_area(), map)
        .map_err(|e| LetheError::Invalid(format!("drawing the heatmap of {}: {e}", map.title)))?;
    Ok(svg)
}

fn draw_heatmap<B: DrawingBackend>(
    area: &DrawingArea<B, Shift>,
    map: &Heatmap,
) -> std::result::Result<(), DrawingAreaErrorKind<B::ErrorType>> {
    area.fill(&WHITE)?;
    let (cols, rows) = (map.lengths.0.len().max(1), map.rows.len().max(1));
    let mut chart = ChartBuilder::on(area)
        .caption(&map.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(Cells(cols), Cells(rows))?;
    let label = |labels: Vec<String>| move |v: &f64| labels.get(v.floor() as usize).cloned().unwrap_or_default();
    let column = label(map.lengths.0.iter().map(usize::to_string).collect());
    let row = label(map.rows.clone());
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(format!("length ({})", map.lengths.1))
        .y_desc("depth")
        .x_labels(cols)
        .y_labels(rows)
        .x_label_formatter(&column)
        .y_label_formatter(&row)
        .label_style(("sans-serif", 14))
        .draw()?;
    let centre = TextStyle::from(("sans-serif", 14)).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    ));
    for (r, line) in map.accuracy.iter().enumerate() {
        for (c, value) in line.iter().enumerate() {
            let (x, y) = (c as f64, r as f64);
            let fill = value.map_or(RGBColor(200, 200, 200), accuracy_colour);
            let corners = [(x, y), (x + 1.0, y + 1.0)];
            chart.draw_series(std::iter::once(Rectangle::new(corners, fill.filled())))?;
            chart.draw_series(std::iter::once(Rectangle::new(corners, WHITE.stroke_width(2))))?;
            let label = value.map_or("-".to_string(), |v| format!("{:.0}", 100.0 * v));
            chart.draw_series(std::iter::once(Text::new(label, (x + 0.5, y + 0.5), centre.clone())))?;
        }
    }
    area.present()
}

/// A heatmap's axis of `n` cells: cell `i` is `[i, i + 1)`, ticked at its centre.
/// (Plotters' segmented integer range collapses when it has one value: one length, or a
/// task without depths.)
struct Cells(usize);

impl plotters::coord::ranged1d::Ranged for Cells {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        limit.0 + (f64::from(limit.1 - limit.0) * value / self.0 as f64).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, _: Hint) -> Vec<f64> {
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.0 as f64
    }
}

/// Red at 0, yellow at 0.5, green at 1.
fn accuracy_colour(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let mix = |a: (f64, f64, f64), b: (f64, f64, f64), t: f64| {
        let c = |p: f64, q: f64| (p + (q - p) * t).round() as u8;
        RGBColor(c(a.0, b.0), c(a.1, b.1), c(a.2, b.2))
    };
    let (red, yellow, green) = ((215.0, 48.0, 39.0), (254.0, 224.0, 139.0), (26.0, 152.0, 80.0));
    if v < 0.5 {
        mix(red, yellow, 2.0 * v)
    } else {
        mix(yellow, green, 2.0 * v - 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heatmap_labels_every_cell_and_colours_it_by_accuracy() {
        let map = Heatmap {
            title: "passkey".into(),
            lengths: (vec![1024, 2048, 4096], "bytes".into()),
            rows: vec!["0%".into(), "50%".into()],
            accuracy: vec![vec![Some(1.0), Some(0.5), None], vec![Some(0.0), Some(0.25), Some(0.75)]],
        };
        let svg = heatmap(&map).unwrap();
        for label in ["passkey", "\n1024\n", "\n4096\n", "\n50%\n", "length (bytes)", "\n100\n", "\n25\n", "\n-\n"] {
            assert!(svg.contains(label), "no {label} in the heatmap");
        }
        assert_eq!(accuracy_colour(0.0), RGBColor(215, 48, 39));
        assert_eq!(accuracy_colour(0.5), RGBColor(254, 224, 139));
        assert_eq!(accuracy_colour(1.0), RGBColor(26, 152, 80));
        assert!(svg_to_png(&svg).is_ok());
        // Two rectangles per cell, its colour and its border (and the background's).
        assert_eq!(svg.matches("<rect").count(), 1 + 2 * 6, "{svg}");
        // One length and one row (a task without depth) still make a cell of full size.
        let one = Heatmap {
            title: "qa1".into(),
            lengths: (vec![1024], "bytes".into()),
            rows: vec!["spread".into()],
            accuracy: vec![vec![Some(0.5)]],
        };
        let svg = heatmap(&one).unwrap();
        assert!(svg.contains("\nspread\n") && svg.contains("\n1024\n") && svg.contains("\n50\n"), "{svg}");
        let widths: Vec<f64> = svg
            .split("<rect")
            .skip(2)
            .map(|r| r.split("width=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap())
            .collect();
        assert!(widths.iter().all(|&w| w > 100.0), "{widths:?}");
    }

    /// Values whose range overflows a float are refused, not drawn (plotters looped
    /// forever over their ticks).
    #[test]
    fn a_range_that_overflows_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let runs = [Curves { name: "r".into(), train: vec![(0.0, 1e308), (1.0, -1e308)], valid: vec![] }];
        let e = plot(&runs, "loss", &dir.path().join("p")).unwrap_err().to_string();
        assert!(e.contains("`loss` runs from -1e308 to 1e308"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing written");
    }

    #[test]
    fn curves_skip_records_without_the_metric() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("a");
        std::fs::create_dir(&run).unwrap();
        let lines = [
            r#"{"step":1,"split":"train","loss":2.0}"#,
            r#"{"step":2,"split":"train","loss":null}"#,
            r#"{"step":2,"split":"valid","loss":1.5}"#,
            "torn line",
        ];
        std::fs::write(run.join("metrics.jsonl"), lines.join("\n")).unwrap();
        let c = read_curves(&run, "loss").unwrap();
        assert_eq!((c.name.as_str(), c.train.clone(), c.valid.clone()), ("a", vec![(1.0, 2.0)], vec![(2.0, 1.5)]));
        let err = read_curves(&run, "nosuch").unwrap_err().to_string();
        assert!(err.contains("no `nosuch`") && err.contains("metrics.jsonl"), "{err}");
        assert_eq!(bounds(&[c]), ((1.0, 2.0), (1.475, 2.025)));
        assert_eq!(log_ticks(3.0, 260.0), vec![5.0, 10.0, 20.0, 50.0, 100.0, 200.0]);
    }

    /// The colour of the PNG's pixel `(x, y)`.
    fn pixel(p: &resvg::tiny_skia::Pixmap, x: u32, y: u32) -> [u8; 4] {
        let c = p.pixel(x, y).unwrap();
        [c.red(), c.green(), c.blue(), c.alpha()]
    }

    #[test]
    fn an_svg_is_drawn_as_png_at_twice_its_size_with_its_text() {
        let svg = r##"<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40" font-family="monospace" font-size="20">
<rect width="100%" height="100%" fill="white"/><rect x="100" y="0" width="20" height="40" fill="#ff0000"/>
<text x="2" y="28">WWW</text></svg>"##;
        let dir = tempfile::tempdir().unwrap();
        let png_path = write_svg_and_png(&dir.path().join("a.svg"), svg).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a.svg")).unwrap(), svg);
        let png = std::fs::read(&png_path).unwrap();
        let p = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        assert_eq!((p.width(), p.height()), (240, 80));
        assert_eq!(pixel(&p, 230, 40), [255, 0, 0, 255]);
        assert_eq!(pixel(&p, 190, 10), [255, 255, 255, 255]);
        // The text is drawn (with a system font for `monospace`): dark pixels where it is.
        let dark =
            (0..80).flat_map(|y| (0..100).map(move |x| (x, y))).filter(|&(x, y)| pixel(&p, x, y)[0] < 100).count();
        assert!(dark > 200, "{dark} dark pixels where the text is");
    }

    #[test]
    fn a_huge_svg_is_drawn_smaller_and_a_broken_one_writes_nothing() {
        let svg = r#"<svg xmlns="http://www.w3.org/2000/svg" width="400" height="100000"><rect width="100%" height="100%" fill="white"/></svg>"#;
        let png = svg_to_png(svg).unwrap();
        let p = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        // 40M pixels at scale 1: drawn at scale sqrt(16/40) = 0.632, as 253 x 63246.
        assert_eq!((p.width(), p.height()), (253, 63246));
        let dir = tempfile::tempdir().unwrap();
        let err = write_svg_and_png(&dir.path().join("b.svg"), "<svg").unwrap_err().to_string();
        assert!(err.contains("b.png"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
