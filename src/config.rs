//! The run configuration: one TOML file describes the topology, model, protocol, judge,
//! environment and the budgets of every stage. Every section has defaults (DESIGN.md §2 where
//! the authors set one); an unknown key or a bad value is an error that names it.
//!
//! Two presets ship: `smollm2` (the embedded SmolLM2-135M, budgets sized for `make demo` on a
//! 2-core CPU in about 10 minutes) and `tiny` (a tiny random model with the same tokenizer, for
//! tests; under 2 minutes). `examples/demo.toml` and `examples/tiny.toml` are complete files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::actors::episode::EpisodeConfig;
use crate::actors::protocol::{ProtocolConfig, RolloutProtocol, ToolRendering};
use crate::actors::task::Split;
use crate::actors::topology::TopologySpec;
use crate::kernels::{EngineConfig, LearnerConfig};
use crate::runtime::{DeviceChoice, DtypeChoice};

/// The whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    pub topology: TopologySpec,
    pub engine: EngineConfig,
    pub protocol: ProtocolConfig,
    /// Judge of self-rehearsal training, by its name in the judge registry
    /// ([`crate::registry`]): `rule_checklist` (default), `bfcl_checker`, `dense_checklist`, or
    /// one a user's crate registered.
    pub judge: JudgeName,
    /// The task suite by its name in the registry ([`crate::registry`]): `bfcl_base`
    /// (default) or one a user's crate registered.
    pub environment: EnvironmentName,
    /// How rollouts are played (training and seed-free stages).
    pub rollout: EpisodeConfig,
    pub collect: CollectConfig,
    pub sft: SftConfig,
    pub train: TrainConfig,
    pub eval: EvalConfig,
    /// Test-time scaling (private rehearsal before the committed execution).
    pub tts: crate::pipeline::TtsConfig,
    /// The long-running training daemon (`envace daemon`): checkpoint cadence and retention.
    pub daemon: DaemonConfig,
}

/// `[daemon]`: how `envace daemon` checkpoints a run that goes on for days. (The batch
/// `envace train` checkpoints every step and keeps only the last.) Periodic evaluation uses
/// `train.eval_every` and `train.eval_tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Write a checkpoint after every this many steps. Default 10.
    pub checkpoint_every_steps: u64,
    /// … and when this many minutes passed since the last one (`None`: steps only). Default 30.
    pub checkpoint_every_minutes: Option<f64>,
    /// Checkpoints kept: the last `keep_last` (at least 1). Default 3.
    pub keep_last: usize,
    /// Also keep the checkpoint with the best periodic evaluation (checklist score). Default on.
    pub keep_best: bool,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            checkpoint_every_steps: 10,
            checkpoint_every_minutes: Some(30.0),
            keep_last: 3,
            keep_best: true,
        }
    }
}

impl DaemonConfig {
    /// [`DaemonConfig::checkpoint_every_minutes`] as a duration.
    pub fn checkpoint_interval(&self) -> Option<std::time::Duration> {
        self.checkpoint_every_minutes
            .filter(|m| m.is_finite() && *m > 0.0)
            .map(|m| std::time::Duration::from_secs_f64(m * 60.0))
    }
}

/// Which model and in which dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `smollm2-135m` (embedded), `tiny`, a `.gguf` file or an HF checkpoint directory.
    pub source: String,
    pub dtype: DtypeChoice,
    pub device: DeviceChoice,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            source: crate::kernels::loader::EMBEDDED_MODEL.into(),
            dtype: DtypeChoice::Auto,
            device: DeviceChoice::Auto,
        }
    }
}

/// A name the registry ([`crate::registry::Registry`]) resolves when a run opens: a string in
/// the config, checked against the registry by [`RunConfig::validate`].
macro_rules! registry_name {
    ($(#[$doc:meta])* $name:ident, $default:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl Default for $name {
            fn default() -> Self {
                Self($default.into())
            }
        }

        impl $name {
            /// The name as written in the config.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

registry_name!(
    /// The judge of self-rehearsal training, by its name in the judge registry.
    JudgeName,
    crate::registry::RULE_CHECKLIST
);

registry_name!(
    /// The task suite (tasks, real environment, evaluation judge), by its name in the
    /// registry: `bfcl_base` (BFCL `multi_turn_base`, fixed split base_0–149 train,
    /// base_150–199 test) or one a user's crate registered.
    EnvironmentName,
    crate::registry::BFCL_BASE
);

/// Seed collection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectConfig {
    /// Collect seeds for at most this many train tasks (`None`: all 150).
    pub tasks: Option<usize>,
}

/// Supervised warm-up: Act rows from seed actions, Rehearse rows from seed observations. Every
/// row of every seed used is trained (see `pipeline::sft`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftConfig {
    /// Passes over the rows.
    pub epochs: u32,
    /// How many train seeds to use (`None`: all), taken stratified over the split's strata.
    pub seeds: Option<usize>,
    /// Whole seeds per optimizer step (all their rows, kept together).
    pub seeds_per_step: usize,
    /// Seed of the per-epoch shuffle of the seeds.
    pub seed: u64,
    pub learner: LearnerConfig,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            epochs: 1,
            seeds: None,
            seeds_per_step: 4,
            seed: 0,
            learner: LearnerConfig {
                lr: 1e-5,
                ..LearnerConfig::default()
            },
        }
    }
}

/// Self-rehearsal role-wise GRPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer steps (one per batch of `tasks_per_step` tasks); a step without any group
    /// whose rewards differ is skipped (reported, no update) but counts.
    pub steps: u64,
    /// Groups per step (with dynamic sampling: informative groups the step looks for).
    pub tasks_per_step: usize,
    /// Trajectories per task (the GRPO group size K).
    pub k: u32,
    /// Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476): a group whose rows all have
    /// the same reward carries no signal; the step draws further tasks until it has
    /// `tasks_per_step` informative groups or has drawn `max_tasks_per_step`, and trains on the
    /// informative groups only. Off: every group drawn is trained (the authors' behaviour).
    pub dynamic_sampling: bool,
    /// Most tasks one step draws with dynamic sampling (`None`: 3 × `tasks_per_step`).
    pub max_tasks_per_step: Option<usize>,
    /// Evaluate on `eval_tasks` tasks spread over the eval split after every this many steps
    /// (`None`: only the final evaluation).
    pub eval_every: Option<u64>,
    /// Tasks of the periodic evaluation (a fixed subset spread evenly over the split).
    pub eval_tasks: usize,
    pub seed: u64,
    pub learner: LearnerConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 470,
            tasks_per_step: 16,
            k: 4,
            dynamic_sampling: false,
            max_tasks_per_step: None,
            eval_every: None,
            eval_tasks: 10,
            seed: 0,
            learner: LearnerConfig::default(),
        }
    }
}

impl TrainConfig {
    /// The most tasks a step draws.
    pub fn max_tasks(&self) -> usize {
        if self.dynamic_sampling {
            self.max_tasks_per_step
                .unwrap_or(3 * self.tasks_per_step)
                .max(self.tasks_per_step)
        } else {
            self.tasks_per_step
        }
    }
}

/// Real-environment evaluation with the BFCL checker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// `test` or `train`.
    pub split: Split,
    /// Evaluate N tasks spread evenly over the split (`None`: all).
    pub tasks: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub act_max_new_tokens: usize,
    pub seed: u64,
    /// Rehearse fidelity: at most this many real calls per evaluated task, in call order
    /// (`None`: every call of the task's ground-truth replay).
    pub fidelity_calls_per_task: Option<usize>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            split: Split::Test,
            tasks: None,
            temperature: 0.6,
            top_p: 0.95,
            act_max_new_tokens: 512,
            seed: 0,
            fidelity_calls_per_task: None,
        }
    }
}

/// A named preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// `make demo`: the embedded SmolLM2-135M, about 25 minutes on a 2-core CPU.
    Smollm2,
    /// The long run (at most 2 hours on a 2-core CPU): the full warm-up (every train seed,
    /// both roles), training with evaluations of a fixed test subset, the final table on 30 test tasks.
    Long,
    /// A tiny random model with SmolLM2's tokenizer, for tests.
    Tiny,
}

impl Preset {
    /// The name `--preset` takes.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Smollm2 => "smollm2",
            Preset::Long => "long",
            Preset::Tiny => "tiny",
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "smollm2" => Ok(Preset::Smollm2),
            "long" => Ok(Preset::Long),
            "tiny" => Ok(Preset::Tiny),
            other => Err(format!("unknown preset {other:?} (smollm2, long, tiny)")),
        }
    }
}

impl RunConfig {
    /// The preset's configuration: small budgets that fit the 2-core CPU.
    pub fn preset(preset: Preset) -> Self {
        let mut c = RunConfig::default();
        c.protocol.tool_rendering = ToolRendering::Compact;
        c.protocol.max_facts = 4;
        c.protocol.max_fact_chars = 200;
        c.topology = TopologySpec {
            policy_workers: 8,
            ..TopologySpec::default()
        };
        c.judge = JudgeName(crate::registry::DENSE_CHECKLIST.into());
        // A seed's user turn takes two Act turns (the calls, then the answer): a third leaves
        // room for a retry and stop a policy that keeps calling from filling the context.
        c.rollout.max_act_turns_per_user_turn = Some(3);
        c.rollout.max_user_turns = Some(1);
        // 95 % of the seeds' call turns fit in 160 tokens, 97 % of their results in 80.
        c.rollout.act_max_new_tokens = 160;
        c.rollout.rehearse_max_new_tokens = 80;
        c.eval.act_max_new_tokens = 160;
        // Rows that share a prefix (a seed's or a trajectory's stream, the K samples of a
        // task) are scored in one packed forward.
        c.sft.learner.pack_prefixes = true;
        c.sft.learner.micro_batch_tokens = 8192;
        c.train.learner.pack_prefixes = true;
        c.sft.learner.lr = 1e-4;
        c.train.dynamic_sampling = true;
        match preset {
            Preset::Smollm2 => {
                c.model.dtype = DtypeChoice::Fast;
                c.protocol.mode = RolloutProtocol::Inline;
                c.sft.seeds = Some(12);
                c.sft.seeds_per_step = 1;
                c.train.steps = 3;
                c.train.tasks_per_step = 2;
                c.train.k = 4;
                c.train.max_tasks_per_step = Some(4);
                c.train.learner.lr = 1e-5;
                c.eval.tasks = Some(30);
                c.eval.fidelity_calls_per_task = Some(1);
            }
            Preset::Long => {
                // Every train seed once: about 92 minutes on 2 cores at a measured 37 s per
                // seed (a seed's stream is one packed forward of 3-4k tokens, compute-bound).
                // What is left of the 2 hours: the final table on 30 test tasks, and a short
                // GRPO run whose test score and fidelity are read every 2 steps on 8 of them.
                c.model.dtype = DtypeChoice::Fast;
                c.protocol.mode = RolloutProtocol::Inline;
                c.sft.seeds = None;
                c.sft.seeds_per_step = 2;
                c.train.steps = 4;
                c.train.tasks_per_step = 2;
                c.train.k = 4;
                c.train.max_tasks_per_step = Some(4);
                c.train.learner.lr = 1e-5;
                c.train.eval_every = Some(2);
                c.train.eval_tasks = 8;
                c.eval.tasks = Some(30);
                c.eval.fidelity_calls_per_task = Some(1);
            }
            Preset::Tiny => {
                c.model.source = "tiny".into();
                c.sft.seeds = Some(2);
                c.sft.seeds_per_step = 1;
                c.train.steps = 2;
                c.train.tasks_per_step = 2;
                c.train.k = 2;
                c.train.max_tasks_per_step = Some(3);
                c.train.learner.lr = 1e-5;
                c.rollout.act_max_new_tokens = 24;
                c.rollout.rehearse_max_new_tokens = 24;
                c.eval.tasks = Some(2);
                c.eval.act_max_new_tokens = 24;
                c.eval.fidelity_calls_per_task = Some(1);
                c.train.eval_every = Some(1);
                c.train.eval_tasks = 1;
            }
        }
        c.finish()
    }

    /// Reads a TOML file; keys it leaves out keep their defaults.
    ///
    /// # Errors
    /// The file cannot be read, or a key is unknown or a value invalid (the message names the
    /// key, line and column).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading config {}: {e}", path.display()))?;
        Self::from_toml(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Parses TOML text and validates it.
    ///
    /// # Errors
    /// As [`RunConfig::from_file`].
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let de = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
        let c: RunConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            // The path names the key (`eval.split`); toml's own message shows its line.
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })?;
        let c = c.finish();
        c.validate()?;
        Ok(c)
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot serialise: {e}\n"))
    }

    /// This configuration with `[protocol] mode = protocol` and what the mode implies for the
    /// other sections (rollout and evaluation episodes follow it; inline turns on the train
    /// learner's `pack_prefixes`).
    pub fn with_protocol(mut self, protocol: RolloutProtocol) -> Self {
        self.protocol.mode = protocol;
        self.finish()
    }

    fn finish(mut self) -> Self {
        // Inline rows of one trajectory share its stream as a token prefix: score them packed,
        // one forward/backward per trajectory (the warm-up keeps each seed's rows together).
        if self.protocol.mode == RolloutProtocol::Inline {
            self.train.learner.pack_prefixes = true;
            self.sft.learner.pack_prefixes = true;
        }
        self
    }

    /// Checks values serde cannot.
    ///
    /// # Errors
    /// A message naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |v: usize, key: &str| {
            if v == 0 {
                Err(format!("{key} must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive(self.topology.policy_workers, "topology.policy_workers")?;
        let registry = crate::registry::installed();
        registry
            .check_judge(self.judge.as_str())
            .map_err(|e| e.to_string())?;
        registry
            .check_suite(self.environment.as_str())
            .map_err(|e| e.to_string())?;
        positive(self.train.tasks_per_step, "train.tasks_per_step")?;
        positive(
            self.daemon.checkpoint_every_steps as usize,
            "daemon.checkpoint_every_steps",
        )?;
        positive(self.daemon.keep_last, "daemon.keep_last")?;
        if let Some(m) = self.daemon.checkpoint_every_minutes {
            if !(m.is_finite() && m > 0.0) {
                return Err(format!(
                    "daemon.checkpoint_every_minutes = {m}: must be a positive number of minutes \
                     (or left out)"
                ));
            }
        }
        positive(self.train.k as usize, "train.k")?;
        positive(self.sft.seeds_per_step, "sft.seeds_per_step")?;
        positive(self.sft.epochs as usize, "sft.epochs")?;
        if self.eval.tasks == Some(0) {
            return Err("eval.tasks must be at least 1 (or left out for the whole split)".into());
        }
        if self.sft.seeds == Some(0) {
            return Err("sft.seeds must be at least 1 (or left out for every seed)".into());
        }
        positive(
            self.rollout.max_generation_calls,
            "rollout.max_generation_calls",
        )?;
        if self.rollout.max_act_turns_per_user_turn == Some(0) {
            return Err(
                "rollout.max_act_turns_per_user_turn must be at least 1 (or left out)".into(),
            );
        }
        positive(
            self.rollout.act_max_new_tokens,
            "rollout.act_max_new_tokens",
        )?;
        positive(
            self.rollout.rehearse_max_new_tokens,
            "rollout.rehearse_max_new_tokens",
        )?;
        positive(self.eval.act_max_new_tokens, "eval.act_max_new_tokens")?;
        for (key, t) in [
            ("rollout.temperature", self.rollout.temperature),
            ("eval.temperature", self.eval.temperature),
        ] {
            if !(t.is_finite() && t >= 0.0) {
                return Err(format!("{key} = {t}: must be a finite number >= 0"));
            }
        }
        for (key, p) in [
            ("rollout.top_p", self.rollout.top_p),
            ("eval.top_p", self.eval.top_p),
        ] {
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("{key} = {p}: must be in (0, 1]"));
            }
        }
        // The learner's log-probs equal the sampling log-probs only for untruncated sampling
        // (kernels/src/sampling.rs): anything else would bias every PPO ratio.
        if self.rollout.top_p != 1.0 || self.rollout.top_k != 0 {
            return Err(format!(
                "rollout.top_p = {} and rollout.top_k = {}: training rollouts must sample the \
                 full distribution (top_p = 1.0, top_k = 0) so the learner's log-probs match",
                self.rollout.top_p, self.rollout.top_k
            ));
        }
        self.sft
            .learner
            .validate()
            .map_err(|e| format!("sft.learner: {e}"))?;
        self.train
            .learner
            .validate()
            .map_err(|e| format!("train.learner: {e}"))?;
        if (self.train.learner.temperature - f64::from(self.rollout.temperature)).abs() > 1e-6 {
            return Err(format!(
                "train.learner.temperature = {} must equal rollout.temperature = {} (the learner \
                 scores with the temperature rollouts were sampled at)",
                self.train.learner.temperature, self.rollout.temperature
            ));
        }
        Ok(())
    }

    /// The budgets a run prints and records.
    pub fn budgets(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model.source,
            "protocol_mode": self.protocol.mode,
            "tool_rendering": self.protocol.tool_rendering,
            "collect_tasks": self.collect.tasks,
            "sft_seeds": self.sft.seeds,
            "sft_epochs": self.sft.epochs,
            "sft_seeds_per_step": self.sft.seeds_per_step,
            "train_steps": self.train.steps,
            "train_tasks_per_step": self.train.tasks_per_step,
            "train_k": self.train.k,
            "rollout_max_user_turns": self.rollout.max_user_turns,
            "act_max_new_tokens": self.rollout.act_max_new_tokens,
            "rehearse_max_new_tokens": self.rollout.rehearse_max_new_tokens,
            "eval_split": self.eval.split,
            "eval_tasks": self.eval.tasks,
            "eval_act_max_new_tokens": self.eval.act_max_new_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_round_trip_through_toml() {
        for p in [Preset::Smollm2, Preset::Long, Preset::Tiny] {
            let c = RunConfig::preset(p);
            c.validate().expect("preset validates");
            let back = RunConfig::from_toml(&c.to_toml()).expect("round trip");
            assert_eq!(back, c);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = RunConfig::from_toml("[train]\nstepz = 3\n").unwrap_err();
        assert!(e.contains("stepz"), "{e}");
        let e = RunConfig::from_toml("[train]\nk = 0\n").unwrap_err();
        assert!(e.contains("train.k"), "{e}");
        let e = RunConfig::from_toml("[protocol]\ntool_rendering = \"tiny\"\n").unwrap_err();
        assert!(e.contains("tool_rendering") || e.contains("tiny"), "{e}");
        let e = RunConfig::from_toml("[rollout]\ntop_p = 0.9\n").unwrap_err();
        assert!(e.contains("rollout.top_p"), "{e}");
        let e = RunConfig::from_toml("[eval]\nsplit = \"dev\"\n").unwrap_err();
        assert!(e.contains("eval.split"), "{e}");
        let e = RunConfig::from_toml("[model]\ndtype = \"f16\"\n").unwrap_err();
        assert!(e.contains("model.dtype") && e.contains("bf16"), "{e}");
        let e = RunConfig::from_toml("[model]\ndevice = \"tpu\"\n").unwrap_err();
        assert!(e.contains("model.device") && e.contains("cuda"), "{e}");
        let c = RunConfig::from_toml("[model]\ndtype = \"bfloat16\"\n").unwrap();
        assert_eq!(c.model.dtype, DtypeChoice::Bf16);
        let e = RunConfig::from_toml("[train.learner]\nlr = -1.0\n").unwrap_err();
        assert!(e.contains("train.learner"), "{e}");
    }

    #[test]
    fn the_example_files_are_the_presets() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        for (file, preset) in [
            ("demo.toml", Preset::Smollm2),
            ("long.toml", Preset::Long),
            ("tiny.toml", Preset::Tiny),
        ] {
            let c = RunConfig::from_file(&dir.join(file)).expect("example parses");
            assert_eq!(
                c,
                RunConfig::preset(preset),
                "{file}: regenerate with `envace config`"
            );
        }
    }

    #[test]
    fn the_long_preset_warms_up_on_every_seed_and_evaluates_over_steps() {
        let c = RunConfig::preset(Preset::Long);
        assert_eq!((c.sft.seeds, c.sft.epochs), (None, 1));
        assert_eq!(
            c.eval.tasks,
            Some(30),
            "the final table is read on 30 test tasks"
        );
        assert_eq!((c.train.eval_every, c.train.eval_tasks), (Some(2), 8));
    }

    #[test]
    fn a_partial_file_keeps_defaults() {
        let c =
            RunConfig::from_toml("[train]\nsteps = 3\n[protocol]\ntool_rendering = \"compact\"\n")
                .expect("parse");
        assert_eq!(c.train.steps, 3);
        assert_eq!(c.train.k, 4);
        assert_eq!(c.protocol.tool_rendering, ToolRendering::Compact);
        assert_eq!(c.train.learner.lr, 1e-6);
        assert_eq!(c.protocol.mode, RolloutProtocol::Reference);
    }

    #[test]
    fn protocol_mode_selects_the_inline_protocol() {
        let c = RunConfig::from_toml("[protocol]\nmode = \"inline\"\n").expect("parse");
        assert_eq!(c.protocol.mode, RolloutProtocol::Inline);
        assert!(
            c.train.learner.pack_prefixes && c.sft.learner.pack_prefixes,
            "inline rows are scored prefix-packed"
        );
        let e = RunConfig::from_toml("[protocol]\nmode = \"stream\"\n").unwrap_err();
        assert!(e.contains("stream") || e.contains("mode"), "{e}");
        // The tests' preset plays the authors' protocol; the SmolLM2 presets the inline one.
        assert_eq!(
            RunConfig::preset(Preset::Tiny).protocol.mode,
            RolloutProtocol::Reference
        );
        for p in [Preset::Smollm2, Preset::Long] {
            let c = RunConfig::preset(p);
            assert_eq!(c.protocol.mode, RolloutProtocol::Inline);
        }
    }
}
