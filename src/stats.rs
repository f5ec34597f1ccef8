//! Confidence intervals over tasks: the percentile bootstrap (Efron & Tibshirani 1993, ch. 13)
//! of a ratio metric, and of the paired difference of two variants on the same tasks.
//!
//! Every evaluation metric is a ratio of per-task sums, `Σ numᵢ / Σ denᵢ` over tasks `i`
//! (task success: `numᵢ ∈ {0, 1}`, `denᵢ = 1`; turn success: turns passed over turns; the share
//! of Act turns with a well-formed call: such turns over Act turns), so the unit that is
//! resampled is the task, as the tasks are the independent draws. A resample draws `n` tasks
//! with replacement (a seeded ChaCha8 stream, so an interval is reproducible) and recomputes the
//! ratio; the interval is the 2.5 % and 97.5 % quantiles of [`RESAMPLES`] resampled ratios
//! (linear interpolation between order statistics, numpy's default). A paired difference
//! resamples the same task indices for both variants, so a per-task effect is not drowned by
//! the spread between tasks. A resample whose denominators sum to 0 (no Act turn drawn, say)
//! has no ratio and is left out, so the interval is conditional on a defined ratio; with the
//! evaluation's metrics this only happens when most tasks have an empty denominator.
//!
//! ```
//! use envace::stats::{bootstrap, PerTask};
//! let tasks: Vec<PerTask> = [0.0, 1.0].iter().map(|&x| PerTask::new(x, 1.0)).collect();
//! let ci = bootstrap(&tasks, 0);
//! assert_eq!((ci.estimate, ci.low, ci.high), (0.5, 0.0, 1.0));
//! ```

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 10_000;
/// Two-sided coverage of the intervals.
pub const LEVEL: f64 = 0.95;

/// One task's contribution to a ratio metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerTask {
    pub num: f64,
    pub den: f64,
}

impl PerTask {
    pub fn new(num: f64, den: f64) -> Self {
        Self { num, den }
    }
}

/// An estimate with its 95 % bootstrap interval; all NaN for no tasks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// The metric on all tasks (`Σ num / Σ den`).
    #[serde(deserialize_with = "nan_if_null")]
    pub estimate: f64,
    /// 2.5 % quantile of the resampled metric.
    #[serde(deserialize_with = "nan_if_null")]
    pub low: f64,
    /// 97.5 % quantile of the resampled metric.
    #[serde(deserialize_with = "nan_if_null")]
    pub high: f64,
}

impl Default for Interval {
    fn default() -> Self {
        Self::NAN
    }
}

impl Interval {
    /// No data.
    pub const NAN: Interval = Interval {
        estimate: f64::NAN,
        low: f64::NAN,
        high: f64::NAN,
    };

    /// True when the whole interval lies above 0 (a difference that is positive at 95 %).
    pub fn above_zero(&self) -> bool {
        self.low > 0.0
    }

    /// `0.123 [0.050, 0.200]`, or `-` with no data.
    pub fn display(&self, percent: bool) -> String {
        if !self.estimate.is_finite() {
            return "-".into();
        }
        let f = |x: f64| {
            if percent {
                format!("{:.1}", 100.0 * x)
            } else {
                format!("{x:.3}")
            }
        };
        format!("{} [{}, {}]", f(self.estimate), f(self.low), f(self.high))
    }
}

fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `Σ num / Σ den` of `tasks` (NaN when `Σ den = 0`).
pub fn ratio(tasks: &[PerTask]) -> f64 {
    let (num, den) = tasks
        .iter()
        .fold((0.0, 0.0), |(n, d), t| (n + t.num, d + t.den));
    if den > 0.0 {
        num / den
    } else {
        f64::NAN
    }
}

/// The ratio metric of `tasks` with its percentile-bootstrap interval over tasks (see the
/// module doc); `seed` fixes the resamples.
pub fn bootstrap(tasks: &[PerTask], seed: u64) -> Interval {
    interval(ratio(tasks), tasks.len(), seed, |pick| {
        ratio(&pick.iter().map(|&i| tasks[i]).collect::<Vec<_>>())
    })
}

/// `metric(b) − metric(a)` for two variants measured on the same tasks, in the same order, with
/// its paired percentile-bootstrap interval (both resampled with the same task indices).
///
/// # Panics
/// Never; tasks beyond the shorter list are left out.
pub fn paired_difference(a: &[PerTask], b: &[PerTask], seed: u64) -> Interval {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    interval(ratio(b) - ratio(a), n, seed, |pick| {
        let take = |v: &[PerTask]| ratio(&pick.iter().map(|&i| v[i]).collect::<Vec<_>>());
        take(b) - take(a)
    })
}

/// The percentile interval of `statistic` over [`RESAMPLES`] resamples of `n` indices.
fn interval(estimate: f64, n: usize, seed: u64, statistic: impl Fn(&[usize]) -> f64) -> Interval {
    if n == 0 || !estimate.is_finite() {
        return Interval::NAN;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pick = vec![0usize; n];
    let mut stats: Vec<f64> = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        for p in pick.iter_mut() {
            *p = rng.random_range(0..n);
        }
        let s = statistic(&pick);
        // A resample whose denominators sum to 0 has no value (e.g. no Act turn drawn).
        if s.is_finite() {
            stats.push(s);
        }
    }
    stats.sort_by(f64::total_cmp);
    let tail = (1.0 - LEVEL) / 2.0;
    Interval {
        estimate,
        low: quantile(&stats, tail),
        high: quantile(&stats, 1.0 - tail),
    }
}

/// The `q` quantile of sorted `xs` with linear interpolation between order statistics.
fn quantile(xs: &[f64], q: f64) -> f64 {
    match xs.len() {
        0 => f64::NAN,
        1 => xs[0],
        n => {
            let h = (n - 1) as f64 * q;
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            xs[lo] + (h - lo as f64) * (xs[hi] - xs[lo])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn means(xs: &[f64]) -> Vec<PerTask> {
        xs.iter().map(|&x| PerTask::new(x, 1.0)).collect()
    }

    #[test]
    fn two_tasks_give_the_hand_computed_interval() {
        // Resampled means of {0, 1}: 0 (p = 1/4), 1/2 (p = 1/2), 1 (p = 1/4). A quarter of the
        // mass at each end puts both 2.5 % tails on the extremes.
        let ci = bootstrap(&means(&[0.0, 1.0]), 7);
        assert_eq!((ci.estimate, ci.low, ci.high), (0.5, 0.0, 1.0));
    }

    #[test]
    fn three_tasks_hand_computed() {
        // {0, 0, 1}: k ones among 3 draws, k ~ Binomial(3, 1/3): P(0) = 8/27 ≈ 0.296,
        // P(1/3) = 12/27, P(2/3) = 6/27, P(1) = 1/27 ≈ 0.037. The 2.5 % quantile lies in the
        // mass at 0; the 97.5 % one in the mass at 1 (P(≥ 1) > 2.5 % and P(< 1) = 26/27 <
        // 97.5 %).
        let ci = bootstrap(&means(&[0.0, 0.0, 1.0]), 3);
        assert!((ci.estimate - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!((ci.low, ci.high), (0.0, 1.0));
    }

    #[test]
    fn constant_samples_and_constant_differences_have_no_width() {
        let ci = bootstrap(&means(&[0.25; 12]), 1);
        assert_eq!((ci.estimate, ci.low, ci.high), (0.25, 0.25, 0.25));
        // b is a plus 0.5 on every task: the paired difference is exactly 0.5, although
        // each variant on its own spreads widely.
        let a = means(&[0.0, 0.5, 0.1, 0.3, 0.0, 0.2]);
        let b: Vec<PerTask> = a.iter().map(|t| PerTask::new(t.num + 0.5, 1.0)).collect();
        let d = paired_difference(&a, &b, 2);
        assert!((d.estimate - 0.5).abs() < 1e-12);
        assert!(
            (d.low - 0.5).abs() < 1e-12 && (d.high - 0.5).abs() < 1e-12,
            "{d:?}"
        );
        assert!(d.above_zero());
        let own = bootstrap(&b, 2);
        assert!(own.high - own.low > 0.2, "{own:?}");
    }

    #[test]
    fn ratios_weigh_tasks_by_their_denominators() {
        // Two tasks: 1 of 1 turn, 0 of 3 turns: 1/4, not the mean of per-task rates (1/2).
        let tasks = [PerTask::new(1.0, 1.0), PerTask::new(0.0, 3.0)];
        assert_eq!(ratio(&tasks), 0.25);
        let ci = bootstrap(&tasks, 0);
        assert_eq!(ci.estimate, 0.25);
        assert!(ci.low <= 0.25 && 0.25 <= ci.high);
        assert_eq!((ci.low, ci.high), (0.0, 1.0));
    }

    #[test]
    fn no_tasks_or_no_denominator_is_nan() {
        assert!(bootstrap(&[], 0).estimate.is_nan());
        assert!(bootstrap(&[PerTask::new(0.0, 0.0)], 0).low.is_nan());
        assert_eq!(Interval::NAN.display(true), "-");
        let ci = Interval {
            estimate: 0.5,
            low: 0.25,
            high: 0.75,
        };
        assert_eq!(ci.display(true), "50.0 [25.0, 75.0]");
        assert_eq!(ci.display(false), "0.500 [0.250, 0.750]");
        let json = serde_json::to_string(&Interval::NAN).unwrap();
        let back: Interval = serde_json::from_str(&json).unwrap();
        assert!(back.estimate.is_nan());
    }

    #[test]
    fn the_same_seed_gives_the_same_interval() {
        let tasks = means(&[0.1, 0.9, 0.4, 0.0, 0.7, 0.2, 0.5]);
        assert_eq!(bootstrap(&tasks, 11), bootstrap(&tasks, 11));
    }
}
