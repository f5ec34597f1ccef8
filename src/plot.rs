//! The training-curve plot of a run: `plot_training` draws reward per role and loss over
//! optimiser steps into a PNG.
//!
//! Text is drawn with DejaVu Sans embedded from the `dejavu` crate, so plotting works on a
//! machine without system fonts.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::report::StepMetrics;

/// Size of the training plot, pixels (width, height).
pub const TRAINING_PLOT_SIZE: (u32, u32) = (900, 600);

const FONT: &str = "sans-serif";
const ACT: RGBColor = RGBColor(31, 119, 180);
const REHEARSE: RGBColor = RGBColor(255, 127, 14);
const OVERALL: RGBColor = RGBColor(40, 40, 40);
const LOSS: RGBColor = RGBColor(214, 39, 40);

/// One curve of a panel: its legend label, colour and the field of a step it plots.
struct Series {
    label: &'static str,
    color: RGBColor,
    value: fn(&StepMetrics) -> f64,
}

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font was rejected by the text renderer.
    #[error("registering the embedded DejaVu Sans font for {path}")]
    Font { path: PathBuf },
    /// Drawing or encoding the image failed (including writing the file).
    #[error("drawing {path}: {reason}")]
    Draw { path: PathBuf, reason: String },
}

/// Writes a PNG of [`TRAINING_PLOT_SIZE`] to `path` with two panels over optimiser steps: mean
/// reward (overall, Act rows, Rehearse rows) on top and loss below.
///
/// Non-finite values are left out of the curves. With no steps it writes empty axes with a
/// note; with one step, single points. The parent directory must exist.
pub fn plot_training(path: &Path, steps: &[StepMetrics]) -> Result<(), PlotError> {
    if !register_fonts() {
        return Err(PlotError::Font {
            path: path.to_path_buf(),
        });
    }
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };

    let root = BitMapBackend::new(path, TRAINING_PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let plural = if steps.len() == 1 { "" } else { "s" };
    let title = format!("EnvACE training ({} step{plural})", steps.len());
    let body = root
        .titled(&title, (FONT, 24).into_font().style(FontStyle::Bold))
        .map_err(|e| draw_err(&e))?;
    let panels = body.split_evenly((2, 1));

    let rewards = [
        Series {
            label: "overall",
            color: OVERALL,
            value: |s| s.reward_mean,
        },
        Series {
            label: "act",
            color: ACT,
            value: |s| s.reward_mean_act,
        },
        Series {
            label: "rehearse",
            color: REHEARSE,
            value: |s| s.reward_mean_rehearse,
        },
    ];
    draw_panel(
        &panels[0],
        steps,
        "mean reward",
        &rewards,
        SeriesLabelPosition::LowerRight,
    )
    .map_err(|e| draw_err(&e))?;
    let losses = [Series {
        label: "loss",
        color: LOSS,
        value: |s| s.loss,
    }];
    draw_panel(
        &panels[1],
        steps,
        "loss",
        &losses,
        SeriesLabelPosition::UpperRight,
    )
    .map_err(|e| draw_err(&e))?;

    root.present().map_err(|e| draw_err(&e))
}

/// One panel: a line per series over steps, axis descriptions and a legend.
fn draw_panel<'a>(
    area: &DrawingArea<BitMapBackend<'a>, Shift>,
    steps: &[StepMetrics],
    y_desc: &str,
    series: &[Series],
    legend_at: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>> {
    let curves: Vec<Vec<(i64, f64)>> = series
        .iter()
        .map(|curve| {
            steps
                .iter()
                .map(|s| (s.step as i64, (curve.value)(s)))
                .filter(|(_, y)| y.is_finite())
                .collect()
        })
        .collect();
    let x = x_range(steps);
    let y = y_range(curves.iter().flatten().map(|&(_, y)| y));

    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.clone(), y.clone())?;
    chart
        .configure_mesh()
        .x_desc("optimiser step")
        .y_desc(y_desc)
        .x_labels(((x.end - x.start) as usize + 1).min(10))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()?;

    if steps.is_empty() {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            "no training steps recorded",
            (w as i32 / 2 - 110, h as i32 / 2 - 10),
            (FONT, 20).into_font().color(&BLACK.mix(0.6)),
        ))?;
        return Ok(());
    }

    for (curve, points) in series.iter().zip(curves) {
        let color = curve.color;
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)).point_size(3))?
            .label(curve.label)
            .legend(move |(lx, ly)| {
                PathElement::new(vec![(lx, ly), (lx + 20, ly)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(legend_at)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// Step axis: the steps' span, widened by one on each side when it is a single step (or none).
fn x_range(steps: &[StepMetrics]) -> Range<i64> {
    let lo = steps.iter().map(|s| s.step as i64).min().unwrap_or(0);
    let hi = steps.iter().map(|s| s.step as i64).max().unwrap_or(0);
    if lo == hi {
        lo - 1..hi + 1
    } else {
        lo..hi
    }
}

/// Value axis: the finite values' span plus 5% each side; ±0.5 around a single value; 0..1
/// when there are none.
fn y_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let span = hi - lo;
    if span <= f64::EPSILON * lo.abs().max(1.0) {
        return lo - 0.5..hi + 0.5;
    }
    lo - 0.05 * span..hi + 0.05 * span
}

/// Registers DejaVu Sans (regular and bold) under [`FONT`] with plotters, once per process;
/// false if plotters rejected the font.
fn register_fonts() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // DejaVu fonts: Bitstream Vera licence plus public-domain DejaVu changes (permissive,
        // embedding allowed); the `dejavu` crate that ships them is MIT/Apache-2.0.
        register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

    fn steps(n: u64) -> Vec<StepMetrics> {
        (0..n)
            .map(|i| StepMetrics {
                step: i,
                reward_mean: 0.2 + 0.1 * i as f64,
                reward_mean_act: 0.1 + 0.12 * i as f64,
                reward_mean_rehearse: 0.3 + 0.05 * i as f64,
                loss: 1.0 / (i + 1) as f64,
                ..Default::default()
            })
            .collect()
    }

    fn check_png(name: &str, steps: &[StepMetrics]) {
        let dir = std::env::temp_dir().join(format!("envace-report-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        plot_training(&path, steps).expect("plot");
        let bytes = std::fs::read(&path).expect("read png");
        assert_eq!(bytes[..8], PNG_SIGNATURE, "{name} is not a PNG");
        assert!(bytes.len() > 5_000, "{name}: only {} bytes", bytes.len());
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn report_plot_training_with_no_steps() {
        check_png("zero.png", &[]);
    }

    #[test]
    fn report_plot_training_with_one_step() {
        check_png("one.png", &steps(1));
    }

    #[test]
    fn report_plot_training_with_five_steps_and_a_nan() {
        let mut s = steps(5);
        s[2].loss = f64::NAN;
        check_png("five.png", &s);
    }

    #[test]
    fn report_plot_training_error_names_the_path() {
        let path = std::env::temp_dir()
            .join(format!("envace-no-such-dir-{}", std::process::id()))
            .join("plot.png");
        let err = plot_training(&path, &steps(2)).expect_err("missing dir must fail");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn report_plot_ranges() {
        assert_eq!(x_range(&[]), -1..1);
        assert_eq!(x_range(&steps(1)), -1..1);
        assert_eq!(x_range(&steps(5)), 0..4);
        assert_eq!(y_range(std::iter::empty()), 0.0..1.0);
        assert_eq!(y_range([2.0].into_iter()), 1.5..2.5);
        let r = y_range([0.0, 10.0].into_iter());
        assert!((r.start + 0.5).abs() < 1e-12 && (r.end - 10.5).abs() < 1e-12);
    }
}
