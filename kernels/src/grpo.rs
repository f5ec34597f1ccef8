//! Role-wise GRPO maths: per-(task, role) advantages and the clipped PPO loss.
//!
//! Sources: DESIGN.md §1 (role-wise baseline, PPO clip, shared parameters) and §2 (defaults:
//! ε_low = ε_high = 0.2, dual clip c = 3.0, no std normalisation, no KL, −0.1 on empty rows);
//! PPO (Schulman et al. 2017, eq. 7); dual-clip PPO (Ye et al. 2020, "Mastering Complex Control
//! in MOBA Games", eq. 5); the k3 estimator (Schulman, "Approximating KL divergence", 2020).
//! Where those are silent, the code follows verl's `compute_grpo_outcome_advantage`,
//! `compute_policy_loss`, `kl_penalty("low_var_kl")` and `agg_loss`, which the authors train with.
//!
//! This module is tensor maths only: it knows nothing of storage or actors, so rows are described
//! by [`RowMeta`], generic over the caller's task-id and role types.
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// Added to the standard deviation before dividing, as verl's `epsilon`.
const STD_EPS: f64 = 1e-6;
/// `new − old` and `ref − new` log-ratios are clamped to ±20 before `exp`, as verl does, so one
/// wild token cannot overflow the loss to inf.
const LOG_RATIO_CLAMP: f64 = 20.0;
/// verl clamps the k3 value per token to ±10.
const KL_CLAMP: f64 = 10.0;

/// How per-token losses become one scalar (verl's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAggregation {
    /// `Σ_{b,t} mask·loss / Σ_{b,t} mask`: every trained token weighs the same (`token-mean`).
    #[default]
    TokenMean,
    /// `mean_b (Σ_t mask·loss / Σ_t mask)` over rows with at least one token: every row weighs
    /// the same whatever its length (`seq-mean-token-mean`).
    SeqMeanTokenMean,
}

/// Role-wise GRPO hyperparameters; defaults are DESIGN.md §2.
///
/// The optional values are written in TOML/JSON as a number, or `false` for off:
/// `dual_clip = false`, `kl_coef = 0.001`, `empty_row_reward = false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Lower clip range: the ratio is clipped below at `1 − eps_low`.
    pub eps_low: f64,
    /// Upper clip range: the ratio is clipped above at `1 + eps_high`.
    pub eps_high: f64,
    /// Dual-clip constant `c > 1`: for `A < 0` the per-token loss is capped at `−c·A`.
    #[serde(with = "number_or_false")]
    pub dual_clip: Option<f64>,
    /// Divide each advantage by its (task, role) group's standard deviation (+1e-6).
    pub std_normalise: bool,
    /// How per-token losses are averaged.
    pub loss_agg: LossAggregation,
    /// Coefficient of the k3 KL penalty to a frozen reference policy; off by default.
    #[serde(with = "number_or_false")]
    pub kl_coef: Option<f64>,
    /// Reward that replaces the trajectory reward on rows whose text is empty.
    #[serde(with = "number_or_false")]
    pub empty_row_reward: Option<f32>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            eps_low: 0.2,
            eps_high: 0.2,
            dual_clip: Some(3.0),
            std_normalise: false,
            loss_agg: LossAggregation::TokenMean,
            kl_coef: None,
            empty_row_reward: Some(-0.1),
        }
    }
}

impl GrpoConfig {
    /// Checks the values a loss can be computed with.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the field: a clip range outside `[0, 1)` (low) or
    /// negative (high), a dual-clip constant not above 1, a negative or non-finite KL coefficient,
    /// a non-finite empty-row reward.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, v: f64, want: &str| {
            Err(Error::InvalidRequest(format!(
                "grpo.{field} = {v}: must be {want}"
            )))
        };
        if !(0.0..1.0).contains(&self.eps_low) {
            return bad("eps_low", self.eps_low, "in [0, 1)");
        }
        if !(self.eps_high >= 0.0 && self.eps_high.is_finite()) {
            return bad("eps_high", self.eps_high, "finite and >= 0");
        }
        if let Some(c) = self.dual_clip {
            if !(c > 1.0 && c.is_finite()) {
                return bad("dual_clip", c, "finite and > 1 (or false)");
            }
        }
        if let Some(k) = self.kl_coef {
            if !(k >= 0.0 && k.is_finite()) {
                return bad("kl_coef", k, "finite and >= 0 (or false)");
            }
        }
        if let Some(r) = self.empty_row_reward {
            if !r.is_finite() {
                return bad("empty_row_reward", f64::from(r), "finite (or false)");
            }
        }
        Ok(())
    }
}

/// What the advantage computation needs of one training row (one generation call).
///
/// `T` is the task identifier and `R` the role (Act / Rehearse); the caller passes its own types
/// (storage's `TaskId` and `Role`), so this crate does not depend on storage.
#[derive(Debug, Clone, PartialEq)]
pub struct RowMeta<T, R> {
    /// The task whose group of K trajectories the row belongs to.
    pub task: T,
    /// The role that generated the row.
    pub role: R,
    /// The trajectory reward R_i, the same on every row of trajectory i.
    pub reward: f32,
    /// True when the row's generated text is empty.
    pub empty: bool,
}

/// The reward a row trains with: its trajectory's reward, or `cfg.empty_row_reward` when the
/// row's text is empty.
///
/// Convention: the penalty *replaces* the reward before the baseline is taken, so it enters
/// μ_{x,r} like any other row's reward. The authors' reward manager writes −0.1 as the row's
/// score and GRPO's group statistics are computed from the scores afterwards; we do the same,
/// and an empty row is thus pushed down relative to its group rather than by a fixed offset.
pub fn row_reward<T, R>(row: &RowMeta<T, R>, cfg: &GrpoConfig) -> f32 {
    match (row.empty, cfg.empty_row_reward) {
        (true, Some(penalty)) => penalty,
        _ => row.reward,
    }
}

/// Role-wise GRPO advantages, one per row, in the order of `rows` (DESIGN.md §1).
///
/// `μ_{x,r}` = mean of [`row_reward`] over all rows of task x and role r — a mean over rows, so
/// a trajectory with more calls of a role weighs more in that role's baseline (the authors'
/// behaviour). `A = R − μ_{x,r}`; with `cfg.std_normalise`, `A = (R − μ) / (σ + 1e-6)` where σ
/// is the unbiased (n − 1) standard deviation of the group, as `torch.std` in verl. A group of
/// one row has A = 0 (its own baseline; σ is taken as 0). Statistics are accumulated in f64.
pub fn role_wise_advantages<T, R>(rows: &[RowMeta<T, R>], cfg: &GrpoConfig) -> Vec<f32>
where
    T: Eq + Hash,
    R: Eq + Hash,
{
    let rewards: Vec<f64> = rows.iter().map(|r| f64::from(row_reward(r, cfg))).collect();
    // (sum, count), then the sum of squared deviations in a second pass for precision.
    let mut groups: HashMap<(&T, &R), (f64, usize, f64)> = HashMap::new();
    for (row, &r) in rows.iter().zip(&rewards) {
        let g = groups.entry((&row.task, &row.role)).or_default();
        g.0 += r;
        g.1 += 1;
    }
    for (row, &r) in rows.iter().zip(&rewards) {
        if let Some(g) = groups.get_mut(&(&row.task, &row.role)) {
            let mean = g.0 / g.1 as f64;
            g.2 += (r - mean) * (r - mean);
        }
    }
    rows.iter()
        .zip(&rewards)
        .map(|(row, &r)| {
            let Some(&(sum, n, ss)) = groups.get(&(&row.task, &row.role)) else {
                return 0.0;
            };
            let a = r - sum / n as f64;
            let a = if cfg.std_normalise {
                let std = if n > 1 {
                    (ss / (n - 1) as f64).sqrt()
                } else {
                    0.0
                };
                a / (std + STD_EPS)
            } else {
                a
            };
            a as f32
        })
        .collect()
}

/// Numbers that describe one [`ppo_loss`] call; all are means over trained (mask = 1) tokens
/// unless said otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PpoStats {
    /// The policy-gradient part of the loss, aggregated as configured.
    pub pg_loss: f64,
    /// Fraction of tokens where the PPO clip is active (verl's `pg_clipfrac`: the clipped term
    /// is strictly larger than the unclipped one).
    pub clip_frac: f64,
    /// Fraction of tokens where the dual clip is active (A < 0 and the loss is capped at −c·A;
    /// verl's `pg_clipfrac_lower`).
    pub clip_frac_lower: f64,
    /// `mean(old − new)`, a first-order estimate of KL(π_old ‖ π_θ) (verl's `ppo_kl`).
    pub approx_kl: f64,
    /// Mean k3 KL to the reference, aggregated as configured; 0 without a reference.
    pub kl: f64,
    /// Trained tokens, Σ mask.
    pub tokens: f64,
    /// Rows with at least one trained token.
    pub rows: f64,
}

impl PpoStats {
    /// The count the loss was averaged over: `tokens` for token-mean, `rows` for
    /// seq-mean-token-mean. With gradient accumulation over micro-batches, scale each
    /// micro-batch's loss by `weight / Σ weight` over the whole batch before `backward`, so the
    /// accumulated gradient equals that of one big batch.
    pub fn weight(&self, agg: LossAggregation) -> f64 {
        match agg {
            LossAggregation::TokenMean => self.tokens,
            LossAggregation::SeqMeanTokenMean => self.rows,
        }
    }
}

impl fmt::Display for PpoStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pg_loss {:.4} clip_frac {:.3} clip_frac_lower {:.3} approx_kl {:.2e} kl {:.2e} tokens {} rows {}",
            self.pg_loss,
            self.clip_frac,
            self.clip_frac_lower,
            self.approx_kl,
            self.kl,
            self.tokens,
            self.rows
        )
    }
}

/// The clipped PPO loss of role-wise GRPO, to minimise (the negated objective of DESIGN.md §1).
///
/// Shapes and dtypes: `new_logprobs`, `old_logprobs`, `mask` and `ref_logprobs`:
/// `[B, C]` f32 (as [`crate::ScoredBatch`]); `advantages`: `[B]` f32, one per row, broadcast over
/// its tokens. Only `new_logprobs` needs autograd history. Returns a scalar f32 loss and stats.
///
/// Per token, with ρ = exp(clamp(new − old, ±20)):
/// ```text
/// L1 = −A·ρ
/// L2 = −A·clip(ρ, 1 − ε_low, 1 + ε_high)
/// L  = max(L1, L2)                        PPO: −min(ρA, clip(ρ)A)
/// L  = min(L, −c·A)        if A < 0       dual clip (only with cfg.dual_clip = Some(c))
/// ```
/// then `loss = agg(L) + β·agg(k3)` when `ref_logprobs` is given and `cfg.kl_coef = Some(β)`,
/// with `k3 = exp(d) − d − 1`, `d = clamp(ref − new, ±20)`, clamped to ±10 (verl's
/// `low_var_kl`, an unbiased low-variance estimate of KL(π_θ ‖ π_ref)). `agg` is
/// [`LossAggregation`]; a batch with no trained token gives loss 0.
///
/// # Errors
/// [`Error::ShapeMismatch`] when the inputs disagree in shape, [`Error::InvalidRequest`] for a
/// config that fails [`GrpoConfig::validate`] or a reference given while `kl_coef` is off (and
/// vice versa: `kl_coef` on without a reference), [`Error::Torch`] from libtorch.
pub fn ppo_loss(
    new_logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    ref_logprobs: Option<&Tensor>,
    cfg: &GrpoConfig,
) -> Result<(Tensor, PpoStats)> {
    cfg.validate()?;
    let shape = new_logprobs.size();
    if shape.len() != 2 {
        return Err(Error::InvalidRequest(format!(
            "new_logprobs must be [rows, tokens], got {shape:?}"
        )));
    }
    let check = |name: &str, t: &Tensor, expected: Vec<i64>| {
        let found = t.size();
        if found == expected {
            Ok(())
        } else {
            Err(Error::ShapeMismatch {
                name: name.into(),
                expected,
                found,
            })
        }
    };
    check("old_logprobs", old_logprobs, shape.clone())?;
    check("mask", mask, shape.clone())?;
    check("advantages", advantages, vec![shape[0]])?;
    let reference = match (ref_logprobs, cfg.kl_coef) {
        (Some(r), Some(beta)) => {
            check("ref_logprobs", r, shape.clone())?;
            Some((r, beta))
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(Error::InvalidRequest(
                "ref_logprobs given but grpo.kl_coef is off".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(Error::InvalidRequest(
                "grpo.kl_coef is set but no ref_logprobs were given".into(),
            ))
        }
    };

    let mask = mask.to_kind(Kind::Float);
    let adv = advantages.to_kind(Kind::Float).unsqueeze(-1);
    let log_ratio = (new_logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.exp();
    let l1 = -&adv * &ratio;
    let l2 = -&adv * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high);
    let clipped = l1.maximum(&l2);
    let (losses, dual_active) = match cfg.dual_clip {
        Some(c) => {
            let l3 = -&adv * c;
            let negative = adv.lt(0.0).expand_as(&clipped);
            let dual = clipped.minimum(&l3);
            let active = clipped.gt_tensor(&l3).logical_and(&negative);
            (dual.where_self(&negative, &clipped), Some(active))
        }
        None => (clipped, None),
    };
    let pg_loss = aggregate(&losses, &mask, cfg.loss_agg);
    let (loss, kl) = match reference {
        Some((r, beta)) => {
            let d = (r - new_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
            let k3 = (d.exp() - &d - 1.0).clamp(-KL_CLAMP, KL_CLAMP);
            let kl = aggregate(&k3, &mask, cfg.loss_agg);
            (&pg_loss + &kl * beta, Some(kl))
        }
        None => (pg_loss.shallow_clone(), None),
    };

    let stats = tch::no_grad(|| -> Result<PpoStats> {
        let tokens = mask.sum(Kind::Float).double_value(&[]);
        let rows = mask
            .sum_dim_intlist(-1, false, Kind::Float)
            .gt(0.0)
            .sum(Kind::Float)
            .double_value(&[]);
        let mean = |t: &Tensor| masked_token_mean(t, &mask).double_value(&[]);
        Ok(PpoStats {
            pg_loss: pg_loss.double_value(&[]),
            clip_frac: mean(&l2.gt_tensor(&l1)),
            clip_frac_lower: dual_active.as_ref().map_or(0.0, mean),
            approx_kl: mean(&-&log_ratio),
            kl: kl.as_ref().map_or(0.0, |k| k.double_value(&[])),
            tokens,
            rows,
        })
    })?;
    Ok((loss, stats))
}

/// `Σ mask·x / max(Σ mask, 1)`, a scalar f32; `x` and `mask` are `[B, C]`.
fn masked_token_mean(x: &Tensor, mask: &Tensor) -> Tensor {
    (x.to_kind(Kind::Float) * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)
}

/// Reduces per-token values `[B, C]` to a scalar as [`LossAggregation`] says. Rows and batches
/// without any trained token contribute nothing (and never divide by zero).
fn aggregate(x: &Tensor, mask: &Tensor, agg: LossAggregation) -> Tensor {
    match agg {
        LossAggregation::TokenMean => masked_token_mean(x, mask),
        LossAggregation::SeqMeanTokenMean => {
            let per_row_tokens = mask.sum_dim_intlist(-1, false, Kind::Float);
            let per_row =
                (x * mask).sum_dim_intlist(-1, false, Kind::Float) / per_row_tokens.clamp_min(1.0);
            let rows = per_row_tokens.gt(0.0).to_kind(Kind::Float);
            (per_row * &rows).sum(Kind::Float) / rows.sum(Kind::Float).clamp_min(1.0)
        }
    }
}

/// Serde for an `Option<number>` written as a number, or `false` (also JSON `null`) for `None`:
/// TOML has no null, and a default of `Some` must still be switchable off from a config file.
mod number_or_false {
    use super::*;
    use serde::de::{self, Visitor};

    pub trait Number: Copy {
        fn from_f64(v: f64) -> Self;
        fn to_f64(self) -> f64;
    }
    impl Number for f64 {
        fn from_f64(v: f64) -> Self {
            v
        }
        fn to_f64(self) -> f64 {
            self
        }
    }
    impl Number for f32 {
        fn from_f64(v: f64) -> Self {
            v as f32
        }
        fn to_f64(self) -> f64 {
            f64::from(self)
        }
    }

    pub fn serialize<S: Serializer, N: Number>(v: &Option<N>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_f64(x.to_f64()),
            None => s.serialize_bool(false),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, N: Number>(d: D) -> Result<Option<N>, D::Error> {
        struct V<N>(std::marker::PhantomData<N>);
        impl<N: Number> Visitor<'_> for V<N> {
            type Value = Option<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, or false for off")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                if v {
                    Err(E::invalid_value(de::Unexpected::Bool(true), &self))
                } else {
                    Ok(None)
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Some(N::from_f64(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Some(N::from_f64(v as f64)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Some(N::from_f64(v as f64)))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Role {
        Act,
        Rehearse,
    }

    fn row(
        task: &'static str,
        role: Role,
        reward: f32,
        empty: bool,
    ) -> RowMeta<&'static str, Role> {
        RowMeta {
            task,
            role,
            reward,
            empty,
        }
    }

    /// Two tasks, both roles; task a's Act group has three rows (two from one trajectory).
    fn group() -> Vec<RowMeta<&'static str, Role>> {
        vec![
            row("a", Role::Act, 1.0, false),
            row("a", Role::Act, 0.0, false),
            row("a", Role::Act, 1.0, false),
            row("a", Role::Rehearse, 1.0, false),
            row("a", Role::Rehearse, 0.0, false),
            row("b", Role::Act, 0.5, false),
            row("b", Role::Act, 0.5, true),
            row("b", Role::Rehearse, 0.25, false),
        ]
    }

    fn assert_close(got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() < tol, "[{i}]: got {g}, want {w}");
        }
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-5, "got {got}, want {want}");
    }

    #[test]
    fn grpo_config_defaults_and_serde() {
        let c = GrpoConfig::default();
        assert_eq!((c.eps_low, c.eps_high, c.dual_clip), (0.2, 0.2, Some(3.0)));
        assert!(!c.std_normalise && c.kl_coef.is_none());
        assert_eq!(c.loss_agg, LossAggregation::TokenMean);
        assert_eq!(c.empty_row_reward, Some(-0.1));
        c.validate().unwrap();

        let c: GrpoConfig = serde_json::from_str(
            r#"{"dual_clip": false, "kl_coef": 0.001, "loss_agg": "seq-mean-token-mean"}"#,
        )
        .unwrap();
        assert_eq!(c.dual_clip, None);
        assert_eq!(c.kl_coef, Some(0.001));
        assert_eq!(c.loss_agg, LossAggregation::SeqMeanTokenMean);
        let back: GrpoConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);

        let err = serde_json::from_str::<GrpoConfig>(r#"{"eps": 0.2}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `eps`"), "{err}");
        assert!(serde_json::from_str::<GrpoConfig>(r#"{"dual_clip": true}"#).is_err());
        let bad = GrpoConfig {
            dual_clip: Some(0.5),
            ..GrpoConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("dual_clip"));
    }

    /// μ(a, Act) = 2/3 over rows (a trajectory-level mean would differ), μ(a, Rehearse) = 1/2,
    /// the empty b/Act row trains with −0.1 so μ(b, Act) = 0.2, a singleton group gets 0.
    #[test]
    fn grpo_advantages_per_task_and_role() {
        let a = role_wise_advantages(&group(), &GrpoConfig::default());
        let third = 1.0 / 3.0;
        assert_close(
            &a,
            &[third, -2.0 * third, third, 0.5, -0.5, 0.3, -0.3, 0.0],
            1e-6,
        );
    }

    /// Unbiased σ: a/Act √(1/3), a/Rehearse √(1/2), b/Act √0.18; singleton stays 0.
    #[test]
    fn grpo_advantages_std_normalised() {
        let cfg = GrpoConfig {
            std_normalise: true,
            ..GrpoConfig::default()
        };
        let a = role_wise_advantages(&group(), &cfg);
        let (s1, s2, s3) = ((1.0f64 / 3.0).sqrt(), 0.5f64.sqrt(), 0.18f64.sqrt());
        let third = 1.0 / 3.0;
        assert_close(
            &a,
            &[
                third / s1,
                -2.0 * third / s1,
                third / s1,
                0.5 / s2,
                -0.5 / s2,
                0.3 / s3,
                -0.3 / s3,
                0.0,
            ],
            1e-5,
        );
        // 0.57735 and −1.1547 by hand.
        assert_close(&a[..3], &[0.57735, -1.154_70, 0.57735], 1e-4);
    }

    #[test]
    fn grpo_empty_row_penalty_can_be_turned_off() {
        let rows = group();
        let on = GrpoConfig::default();
        assert_eq!(row_reward(&rows[6], &on), -0.1);
        assert_eq!(row_reward(&rows[5], &on), 0.5);
        let off = GrpoConfig {
            empty_row_reward: None,
            ..on
        };
        assert_eq!(row_reward(&rows[6], &off), 0.5);
        let a = role_wise_advantages(&rows, &off);
        assert_close(&a[5..7], &[0.0, 0.0], 1e-7);
    }

    /// Row 0 has A = +1 with ratios 1.1 (inside), 1.5 (clipped to 1.2), 0.5 (below range, but
    /// min picks the unclipped 0.5) and one padding token; row 1 has A = −1 with ratios 0.9
    /// (inside), 0.5 (clipped to 0.8), 1.5 (above range, unclipped), 4.0 (dual clip at c = 3).
    /// Per-token losses: [−1.1, −1.2, −0.5 | 0.9, 0.8, 1.5, 3.0].
    fn ppo_case() -> (Tensor, Tensor, Tensor, Tensor) {
        let ratios = [1.1f32, 1.5, 0.5, 1.0, 0.9, 0.5, 1.5, 4.0];
        let old = Tensor::from_slice(&[-1.0f32, -2.0, -0.5, 0.0, -1.5, -3.0, -0.25, -2.0])
            .reshape([2, 4]);
        let new = &old + Tensor::from_slice(&ratios).log().reshape([2, 4]);
        let adv = Tensor::from_slice(&[1.0f32, -1.0]);
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]).reshape([2, 4]);
        (new, old, adv, mask)
    }

    #[test]
    fn grpo_ppo_loss_clip_and_dual_clip_token_mean() {
        let (new, old, adv, mask) = ppo_case();
        let (loss, stats) =
            ppo_loss(&new, &old, &adv, &mask, None, &GrpoConfig::default()).unwrap();
        // (−1.1 − 1.2 − 0.5 + 0.9 + 0.8 + 1.5 + 3.0) / 7 = 3.4 / 7
        close(loss.double_value(&[]), 3.4 / 7.0);
        close(stats.pg_loss, 3.4 / 7.0);
        // PPO clip active on ρ = 1.5 (A > 0) and ρ = 0.5 (A < 0); dual clip on ρ = 4.
        close(stats.clip_frac, 2.0 / 7.0);
        close(stats.clip_frac_lower, 1.0 / 7.0);
        let ln = |x: f64| x.ln();
        let approx_kl =
            -(ln(1.1) + ln(1.5) + ln(0.5) + ln(0.9) + ln(0.5) + ln(1.5) + ln(4.0)) / 7.0;
        close(stats.approx_kl, approx_kl);
        assert_eq!((stats.tokens, stats.rows, stats.kl), (7.0, 2.0, 0.0));
        assert_eq!(stats.weight(LossAggregation::TokenMean), 7.0);

        // Without the dual clip the ρ = 4 token costs 4: 4.4 / 7.
        let cfg = GrpoConfig {
            dual_clip: None,
            ..GrpoConfig::default()
        };
        let (loss, stats) = ppo_loss(&new, &old, &adv, &mask, None, &cfg).unwrap();
        close(loss.double_value(&[]), 4.4 / 7.0);
        assert_eq!(stats.clip_frac_lower, 0.0);
    }

    /// Same tokens, ragged mask: row means −2.8/3 and 6.2/4; an all-padding row is ignored.
    #[test]
    fn grpo_ppo_loss_seq_mean_token_mean() {
        let (new, old, adv, mask) = ppo_case();
        let cfg = GrpoConfig {
            loss_agg: LossAggregation::SeqMeanTokenMean,
            ..GrpoConfig::default()
        };
        let (loss, stats) = ppo_loss(&new, &old, &adv, &mask, None, &cfg).unwrap();
        let want = (-2.8 / 3.0 + 6.2 / 4.0) / 2.0;
        close(loss.double_value(&[]), want);
        assert_eq!(stats.weight(cfg.loss_agg), 2.0);

        let pad = |t: &Tensor, v: f32| {
            Tensor::cat(
                &[
                    t.shallow_clone(),
                    Tensor::full([1, 4], v as f64, (Kind::Float, tch::Device::Cpu)),
                ],
                0,
            )
        };
        let adv3 = Tensor::from_slice(&[1.0f32, -1.0, 5.0]);
        let (loss, stats) = ppo_loss(
            &pad(&new, -1.0),
            &pad(&old, -3.0),
            &adv3,
            &pad(&mask, 0.0),
            None,
            &cfg,
        )
        .unwrap();
        close(loss.double_value(&[]), want);
        assert_eq!(stats.rows, 2.0);
    }

    /// k3 with d = ref − new: d = 0.5 → e^0.5 − 1.5 = 0.148721; d = −1 → e^−1 = 0.367879.
    #[test]
    fn grpo_k3_kl_penalty() {
        let new = Tensor::from_slice(&[-1.0f32, -2.0]).reshape([1, 2]);
        let reference = Tensor::from_slice(&[-0.5f32, -3.0]).reshape([1, 2]);
        let mask = Tensor::ones([1, 2], (Kind::Float, tch::Device::Cpu));
        let adv = Tensor::from_slice(&[0.0f32]);
        let cfg = GrpoConfig {
            kl_coef: Some(0.1),
            ..GrpoConfig::default()
        };
        let (loss, stats) = ppo_loss(&new, &new, &adv, &mask, Some(&reference), &cfg).unwrap();
        let k3 = (0.148_721 + 0.367_879) / 2.0;
        assert!((stats.kl - k3).abs() < 1e-5, "{}", stats.kl);
        assert!((loss.double_value(&[]) - 0.1 * k3).abs() < 1e-6);
        // A reference without a coefficient (or the reverse) is a caller bug, not silently 0.
        assert!(ppo_loss(
            &new,
            &new,
            &adv,
            &mask,
            Some(&reference),
            &GrpoConfig::default()
        )
        .is_err());
        assert!(ppo_loss(&new, &new, &adv, &mask, None, &cfg).is_err());
    }

    /// Token-mean over 4 tokens: an unclipped token has ∂L/∂new = −A·ρ/4; a PPO-clipped
    /// (A = 2, ρ = 1.5) and a dual-clipped (A = −1, ρ = 4) token have zero gradient.
    #[test]
    fn grpo_gradient_flows_only_through_unclipped_tokens() {
        let old = Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu));
        let new = Tensor::from_slice(&[1.1f32, 1.5, 1.5, 4.0])
            .log()
            .reshape([2, 2])
            .set_requires_grad(true);
        let adv = Tensor::from_slice(&[2.0f32, -1.0]);
        let mask = Tensor::ones([2, 2], (Kind::Float, tch::Device::Cpu));
        let (loss, _) = ppo_loss(&new, &old, &adv, &mask, None, &GrpoConfig::default()).unwrap();
        // (−2.2 − 2.4 + 1.5 + 3.0) / 4
        close(loss.double_value(&[]), -0.1 / 4.0);
        loss.backward();
        let g: Vec<f32> = Vec::try_from(new.grad().reshape([-1])).unwrap();
        assert_close(&g, &[-2.0 * 1.1 / 4.0, 0.0, 1.5 / 4.0, 0.0], 1e-6);
    }

    #[test]
    fn grpo_ppo_loss_rejects_mismatched_shapes() {
        let (new, old, adv, mask) = ppo_case();
        let short = Tensor::from_slice(&[1.0f32]);
        let err = ppo_loss(&new, &old, &short, &mask, None, &GrpoConfig::default()).unwrap_err();
        assert!(err.to_string().contains("advantages"), "{err}");
        let err = ppo_loss(
            &new,
            &old.narrow(1, 0, 3),
            &adv,
            &mask,
            None,
            &GrpoConfig::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("old_logprobs"), "{err}");
    }
}
