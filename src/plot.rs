//! The training-curve plot of a run: `plot_training` draws reward per role, the groups and
//! steps without signal, the periodic test score and the gradient norm over optimiser steps
//! into a PNG.
//!
//! Text is drawn with DejaVu Sans embedded from the `dejavu` crate, so plotting works on a
//! machine without system fonts.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::report::{StepMetrics, TrainReport};
use crate::stats::Interval;

/// Size of the training plot, pixels (width, height).
pub const TRAINING_PLOT_SIZE: (u32, u32) = (1200, 800);

const FONT: &str = "sans-serif";
const ACT: RGBColor = RGBColor(31, 119, 180);
const REHEARSE: RGBColor = RGBColor(255, 127, 14);
const OVERALL: RGBColor = RGBColor(40, 40, 40);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREEN: RGBColor = RGBColor(44, 160, 44);

/// One curve of a panel: its legend label, colour, points and optional 95 % interval bars
/// `(x, low, high)`.
struct Curve {
    label: &'static str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
    bars: Vec<(f64, f64, f64)>,
}

impl Curve {
    fn new(label: &'static str, color: RGBColor, points: Vec<(f64, f64)>) -> Self {
        Self {
            label,
            color,
            points: points.into_iter().filter(|(_, y)| y.is_finite()).collect(),
            bars: Vec::new(),
        }
    }
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

/// Writes a PNG of [`TRAINING_PLOT_SIZE`] to `path` with four panels over optimiser steps:
///
/// * mean reward of the rollouts, overall and per role (Act rows, Rehearse rows), skipped
///   steps marked with a cross;
/// * the fraction of groups without a reward spread per step, and the running fraction of
///   skipped steps;
/// * the periodic evaluation on the test subset: checklist score and Rehearse fidelity (exact
///   values) with their 95 % intervals;
/// * the gradient norm of each update (skipped steps have none).
///
/// A judge swapped while the run went on (`train.judges`) is a dashed vertical line in every
/// panel at the steps done when it took over, labelled with the judge's name.
///
/// Non-finite values are left out. An empty panel says so. The parent directory must exist.
pub fn plot_training(path: &Path, train: &TrainReport) -> Result<(), PlotError> {
    if !register_fonts() {
        return Err(PlotError::Font {
            path: path.to_path_buf(),
        });
    }
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let steps = &train.steps;
    let root = BitMapBackend::new(path, TRAINING_PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let skipped = steps.iter().filter(|s| s.skipped).count();
    let title = format!(
        "EnvACE training ({} step{}, {skipped} skipped)",
        steps.len(),
        if steps.len() == 1 { "" } else { "s" }
    );
    let body = root
        .titled(&title, (FONT, 24).into_font().style(FontStyle::Bold))
        .map_err(|e| draw_err(&e))?;
    let panels = body.split_evenly((2, 2));
    // Steps are plotted at their count of steps done (step n ends at n + 1), like the
    // periodic evaluations, so both share the axis.
    let at = |s: &StepMetrics| (s.step + 1) as f64;
    let series = |f: fn(&StepMetrics) -> f64| steps.iter().map(|s| (at(s), f(s))).collect();
    let skips = Curve::new(
        "skipped step",
        RED,
        steps
            .iter()
            .filter(|s| s.skipped)
            .map(|s| (at(s), s.reward_mean))
            .collect(),
    );
    let x = x_range(
        steps
            .iter()
            .map(at)
            .chain(train.evals.iter().map(|e| e.step as f64)),
    );
    // A change in force from step s (0-based) takes over after s steps done.
    let marks: Vec<(f64, String)> = train
        .judges
        .iter()
        .map(|j| (j.step as f64, format!("judge: {}", j.judge)))
        .collect();
    let draw_panel =
        |area, x, y_desc, curves, empty| draw_panel(area, x, y_desc, curves, empty, &marks);
    draw_panel(
        &panels[0],
        x.clone(),
        "mean reward of the rollouts",
        vec![
            Curve::new("overall", OVERALL, series(|s| s.reward_mean)),
            Curve::new("act rows", ACT, series(|s| s.reward_mean_act)),
            Curve::new(
                "rehearse rows",
                REHEARSE,
                series(|s| s.reward_mean_rehearse),
            ),
            skips,
        ],
        "no training steps recorded",
    )
    .map_err(|e| draw_err(&e))?;
    let mut running = Vec::new();
    let mut n_skipped = 0;
    for (i, s) in steps.iter().enumerate() {
        n_skipped += usize::from(s.skipped);
        running.push((at(s), n_skipped as f64 / (i + 1) as f64));
    }
    draw_panel(
        &panels[1],
        x.clone(),
        FRACTION,
        vec![
            Curve::new(
                "zero-variance groups",
                OVERALL,
                series(|s| s.zero_variance_fraction),
            ),
            Curve::new("skipped steps so far", RED, running),
        ],
        "no training steps recorded",
    )
    .map_err(|e| draw_err(&e))?;
    let interval = |f: fn(&crate::report::PeriodicEval) -> Interval, label, color| {
        let mut c = Curve::new(
            label,
            color,
            train
                .evals
                .iter()
                .map(|e| (e.step as f64, f(e).estimate))
                .collect(),
        );
        c.bars = train
            .evals
            .iter()
            .map(|e| (e.step as f64, f(e).low, f(e).high))
            .filter(|(_, lo, hi)| lo.is_finite() && hi.is_finite())
            .collect();
        c
    };
    draw_panel(
        &panels[2],
        x.clone(),
        "test subset (95 % CI)",
        vec![
            interval(|e| e.metrics.checklist_score, "checklist score", GREEN),
            interval(|e| e.fidelity_equal_values, "rehearse fidelity", REHEARSE),
        ],
        "no periodic evaluation (train.eval_every)",
    )
    .map_err(|e| draw_err(&e))?;
    draw_panel(
        &panels[3],
        x,
        "gradient norm",
        vec![Curve::new(
            "grad norm of updates",
            ACT,
            steps
                .iter()
                .filter(|s| !s.skipped)
                .map(|s| (at(s), s.grad_norm))
                .collect(),
        )],
        "no update",
    )
    .map_err(|e| draw_err(&e))?;
    root.present().map_err(|e| draw_err(&e))
}

/// The y description of panels whose values are fractions.
const FRACTION: &str = "fraction";

/// One panel: a line (and interval bars) per curve over steps, axis descriptions, a legend;
/// `empty` written in the middle when no curve has a point.
fn draw_panel<'a>(
    area: &DrawingArea<BitMapBackend<'a>, Shift>,
    x: Range<f64>,
    y_desc: &str,
    curves: Vec<Curve>,
    empty: &str,
    marks: &[(f64, String)],
) -> Result<(), DrawingAreaErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>> {
    // Fractions keep their whole [0, 1] scale, so an all-zero series reads as zero.
    let y = if y_desc == FRACTION {
        -0.02..1.02
    } else {
        y_range(curves.iter().flat_map(|c| {
            c.points
                .iter()
                .map(|p| p.1)
                .chain(c.bars.iter().flat_map(|b| [b.1, b.2]))
        }))
    };
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.clone(), y.clone())?;
    // Steps are whole numbers: one label per step up to 10 steps.
    let x_labels = ((x.end - x.start).round() as usize + 1).clamp(2, 11);
    chart
        .configure_mesh()
        .x_desc("training steps done")
        .y_desc(y_desc)
        .x_labels(x_labels)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()?;
    if curves.iter().all(|c| c.points.is_empty()) {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            empty.to_string(),
            (w as i32 / 2 - 150, h as i32 / 2 - 10),
            (FONT, 18).into_font().color(&BLACK.mix(0.6)),
        ))?;
        return Ok(());
    }
    for (mx, label) in marks.iter().filter(|(mx, _)| x.contains(mx)) {
        // Dashed: short segments along the line.
        let n = 24;
        let dy = (y.end - y.start) / f64::from(2 * n);
        chart.draw_series((0..n).map(|i| {
            let y0 = y.start + f64::from(2 * i) * dy;
            PathElement::new(
                vec![(*mx, y0), (*mx, y0 + dy)],
                BLACK.mix(0.5).stroke_width(1),
            )
        }))?;
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*mx, y.end),
            (FONT, 12).into_font().color(&BLACK.mix(0.7)),
        )))?;
    }
    for curve in curves.into_iter().filter(|c| !c.points.is_empty()) {
        let color = curve.color;
        for (bx, lo, hi) in &curve.bars {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(*bx, *lo), (*bx, *hi)],
                color.mix(0.6).stroke_width(2),
            )))?;
        }
        let line = if curve.label == "skipped step" {
            chart.draw_series(
                curve
                    .points
                    .iter()
                    .map(|&p| Cross::new(p, 6, color.stroke_width(2))),
            )?
        } else {
            chart.draw_series(
                LineSeries::new(curve.points.clone(), color.stroke_width(2)).point_size(3),
            )?
        };
        line.label(curve.label).legend(move |(lx, ly)| {
            PathElement::new(vec![(lx, ly), (lx + 20, ly)], color.stroke_width(2))
        });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// Step axis: the span of `xs`, widened by one on each side when it is a single point (or
/// none).
fn x_range(xs: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return -1.0..1.0;
    }
    if lo == hi {
        lo - 1.0..hi + 1.0
    } else {
        lo..hi
    }
}

/// Value axis: the finite values' span plus 5% each side; ±0.5 around a single value; 0..1
/// when there are none; starting just below 0 when no value is negative.
fn y_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let span = hi - lo;
    let r = if span <= f64::EPSILON * lo.abs().max(1.0) {
        lo - 0.5..hi + 0.5
    } else {
        lo - 0.05 * span..hi + 0.05 * span
    };
    // Rewards, scores and norms are not negative: no axis below zero for them.
    if lo >= 0.0 && r.start < 0.0 {
        return -0.02 * r.end..r.end;
    }
    r
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
        let train = TrainReport {
            steps: steps.to_vec(),
            ..TrainReport::default()
        };
        check_report_png(name, &train);
    }

    fn check_report_png(name: &str, train: &TrainReport) {
        let dir = std::env::temp_dir().join(format!("envace-report-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        plot_training(&path, train).expect("plot");
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
    fn report_plot_training_with_five_steps_a_nan_a_skip_and_evaluations() {
        let mut s = steps(5);
        s[2].loss = f64::NAN;
        s[3].skipped = true;
        let ci = |v: f64| Interval {
            estimate: v,
            low: v - 0.1,
            high: v + 0.1,
        };
        let evals = [0u64, 5]
            .iter()
            .map(|&step| crate::report::PeriodicEval {
                step,
                metrics: crate::report::EvalMetrics {
                    checklist_score: ci(0.3 + 0.01 * step as f64),
                    ..Default::default()
                },
                fidelity_equal_values: ci(0.2),
                ..Default::default()
            })
            .collect();
        check_report_png(
            "five.png",
            &TrainReport {
                steps: s,
                evals,
                // A judge swap marked at 3 steps done.
                judges: vec![crate::pipeline::control::JudgeChange {
                    step: 3,
                    judge: "rule_checklist".into(),
                    requested_unix_s: 0,
                }],
                ..TrainReport::default()
            },
        );
    }

    #[test]
    fn report_plot_training_error_names_the_path() {
        let path = std::env::temp_dir()
            .join(format!("envace-no-such-dir-{}", std::process::id()))
            .join("plot.png");
        let train = TrainReport {
            steps: steps(2),
            ..TrainReport::default()
        };
        let err = plot_training(&path, &train).expect_err("missing dir must fail");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn report_plot_ranges() {
        assert_eq!(x_range(std::iter::empty()), -1.0..1.0);
        assert_eq!(x_range([1.0].into_iter()), 0.0..2.0);
        assert_eq!(x_range([1.0, 5.0, 0.0].into_iter()), 0.0..5.0);
        assert_eq!(y_range(std::iter::empty()), 0.0..1.0);
        assert_eq!(y_range([2.0].into_iter()), 1.5..2.5);
        let r = y_range([0.0, 10.0].into_iter());
        assert!((r.start + 0.21).abs() < 1e-12 && (r.end - 10.5).abs() < 1e-12);
        let r = y_range([-1.0, 9.0].into_iter());
        assert!((r.start + 1.5).abs() < 1e-12 && (r.end - 9.5).abs() < 1e-12);
        assert_eq!(y_range([0.0].into_iter()), -0.01..0.5);
    }
}
