//! Judges by name: what `judge = "…"` in a run config selects for self-rehearsal training.
//!
//! [`Registry::builtin`] holds the three BFCL judges. A user's crate adds its own judge with
//! [`Registry::register_judge`] and runs the whole `envace` command line on it with
//! [`crate::cli::run_with`], so `train --config` (and `demo`, `sft`, …) train with that judge
//! (`examples/custom_judge.rs`). One registry serves a process: the first [`install`] wins, and
//! without one the built-in registry is used.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::actors::Judge;
use crate::bfcl::dense::DenseChecklistJudge;
use crate::bfcl::episode::BfclSuite;
use crate::bfcl::judge::RuleChecklistJudge;

/// The default judge: one checklist item per ground-truth call, matched without executing.
pub const RULE_CHECKLIST: &str = "rule_checklist";
/// BFCL's own checker, which re-executes the calls in a sandbox.
pub const BFCL_CHECKER: &str = "bfcl_checker";
/// The rule checklist with partial credit for format, tool names, argument names and values
/// ([`crate::bfcl::dense`]); 1 exactly when the rule checklist gives 1.
pub const DENSE_CHECKLIST: &str = "dense_checklist";

/// What a judge is built from: the run's task suite (its ground truth, for judges that need
/// more than a task's checklist).
pub struct JudgeContext<'a> {
    /// The BFCL suite the run's tasks come from.
    pub suite: &'a BfclSuite,
}

/// Builds a judge for a run.
pub type JudgeFactory = Arc<dyn Fn(&JudgeContext<'_>) -> Arc<dyn Judge> + Send + Sync>;

/// A name was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// `judge = name` names no registered judge.
    #[error("judge = {name:?} is not registered; registered judges: {known}")]
    UnknownJudge {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
}

/// Judges by name (see the module doc).
#[derive(Clone)]
pub struct Registry {
    judges: BTreeMap<String, JudgeFactory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("judges", &self.judge_names())
            .finish()
    }
}

impl Registry {
    /// No judges at all.
    pub fn empty() -> Self {
        Self {
            judges: BTreeMap::new(),
        }
    }

    /// The built-in judges: [`RULE_CHECKLIST`], [`BFCL_CHECKER`] and [`DENSE_CHECKLIST`].
    pub fn builtin() -> Self {
        let mut r = Self::empty();
        r.register_judge(RULE_CHECKLIST, |_| Arc::new(RuleChecklistJudge));
        r.register_judge(BFCL_CHECKER, |ctx| {
            Arc::new(ctx.suite.checker_judge(Default::default()))
        });
        r.register_judge(DENSE_CHECKLIST, |_| Arc::new(DenseChecklistJudge));
        r
    }

    /// Adds (or replaces) the judge `name`, built by `factory` when a run opens.
    pub fn register_judge(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn(&JudgeContext<'_>) -> Arc<dyn Judge> + Send + Sync + 'static,
    ) -> &mut Self {
        self.judges.insert(name.into(), Arc::new(factory));
        self
    }

    /// The registered judge names, sorted.
    pub fn judge_names(&self) -> Vec<&str> {
        self.judges.keys().map(String::as_str).collect()
    }

    /// Checks that `name` is registered, without building it.
    ///
    /// # Errors
    /// [`RegistryError::UnknownJudge`], listing the registered names.
    pub fn check_judge(&self, name: &str) -> Result<(), RegistryError> {
        if self.judges.contains_key(name) {
            Ok(())
        } else {
            Err(RegistryError::UnknownJudge {
                name: name.to_string(),
                known: self.judge_names().join(", "),
            })
        }
    }

    /// Builds the judge `name` for a run.
    ///
    /// # Errors
    /// [`RegistryError::UnknownJudge`], listing the registered names.
    pub fn judge(
        &self,
        name: &str,
        ctx: &JudgeContext<'_>,
    ) -> Result<Arc<dyn Judge>, RegistryError> {
        self.check_judge(name)?;
        Ok((self.judges[name])(ctx))
    }
}

static INSTALLED: OnceLock<Registry> = OnceLock::new();

/// Makes `registry` the one this process's runs use; call before the first run opens.
///
/// # Errors
/// Gives `registry` back when one is installed already (or a run has already used the
/// built-in one).
pub fn install(registry: Registry) -> Result<(), Registry> {
    INSTALLED.set(registry)
}

/// The registry runs use: the installed one, or [`Registry::builtin`].
pub fn installed() -> &'static Registry {
    INSTALLED.get_or_init(Registry::builtin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::PassThroughJudge;

    #[test]
    fn builtin_judges_are_registered_and_unknown_names_list_them() {
        let mut r = Registry::builtin();
        assert_eq!(
            r.judge_names(),
            ["bfcl_checker", "dense_checklist", "rule_checklist"]
        );
        let e = r.check_judge("lenient").unwrap_err();
        assert_eq!(
            e.to_string(),
            "judge = \"lenient\" is not registered; registered judges: bfcl_checker, \
             dense_checklist, rule_checklist"
        );
        r.register_judge("lenient", |_| Arc::new(PassThroughJudge));
        assert!(r.check_judge("lenient").is_ok());
        assert_eq!(r.judge_names().len(), 4);
    }
}
