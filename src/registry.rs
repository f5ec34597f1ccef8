//! Judges and task suites by name: what `judge = "…"` and `environment = "…"` in a run config
//! select.
//!
//! [`Registry::builtin`] holds the three BFCL judges and the BFCL `multi_turn_base` suite. A
//! user's crate adds its own judge with [`Registry::register_judge`] (and its own tasks,
//! environment and evaluation judge with [`Registry::register_suite`]) and runs the whole
//! `envace` command line on them with [`crate::cli::run_with`], so `train --config` (and
//! `demo`, `sft`, …) train with them (`examples/custom_judge.rs`). One registry serves a
//! process: the first [`install`] wins, and without one the built-in registry is used.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::actors::Judge;
use crate::bfcl::dense::DenseChecklistJudge;
use crate::bfcl::episode::BfclSuite;
use crate::bfcl::judge::RuleChecklistJudge;
use crate::suite::{SuiteError, TaskSuite};

/// The default judge: one checklist item per ground-truth call, matched without executing.
pub const RULE_CHECKLIST: &str = "rule_checklist";
/// The suite's evaluation judge ([`TaskSuite::evaluation_judge`]); for BFCL its own checker,
/// which re-executes the calls in a sandbox.
pub const BFCL_CHECKER: &str = "bfcl_checker";
/// The rule checklist with partial credit for format, tool names, argument names and values
/// ([`crate::bfcl::dense`]); 1 exactly when the rule checklist gives 1.
pub const DENSE_CHECKLIST: &str = "dense_checklist";
/// The default suite: BFCL `multi_turn_base` with its fixed 150/50 split.
pub const BFCL_BASE: &str = crate::bfcl::suite::BFCL_BASE;

/// What a judge is built from: the run's task suite.
pub struct JudgeContext<'a> {
    /// The suite the run's tasks come from.
    pub suite: &'a dyn TaskSuite,
}

/// Builds a judge for a run.
pub type JudgeFactory = Arc<dyn Fn(&JudgeContext<'_>) -> Arc<dyn Judge> + Send + Sync>;

/// Loads a task suite for a run.
pub type SuiteFactory = Arc<dyn Fn() -> Result<Arc<dyn TaskSuite>, SuiteError> + Send + Sync>;

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
    /// `environment = name` names no registered suite.
    #[error("environment = {name:?} is not registered; registered environments: {known}")]
    UnknownSuite {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
}

/// Judges and suites by name (see the module doc).
#[derive(Clone)]
pub struct Registry {
    judges: BTreeMap<String, JudgeFactory>,
    suites: BTreeMap<String, SuiteFactory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("judges", &self.judge_names())
            .field("suites", &self.suite_names())
            .finish()
    }
}

impl Registry {
    /// No judges and no suites at all.
    pub fn empty() -> Self {
        Self {
            judges: BTreeMap::new(),
            suites: BTreeMap::new(),
        }
    }

    /// The built-in judges ([`RULE_CHECKLIST`], [`BFCL_CHECKER`], [`DENSE_CHECKLIST`]) and
    /// suite ([`BFCL_BASE`]).
    pub fn builtin() -> Self {
        let mut r = Self::empty();
        r.register_judge(RULE_CHECKLIST, |_| Arc::new(RuleChecklistJudge));
        r.register_judge(BFCL_CHECKER, |ctx| ctx.suite.evaluation_judge());
        r.register_judge(DENSE_CHECKLIST, |_| Arc::new(DenseChecklistJudge));
        r.register_suite(BFCL_BASE, || {
            let suite = BfclSuite::load_base().map_err(|e| SuiteError::Load {
                suite: BFCL_BASE.into(),
                source: Box::new(e),
            })?;
            Ok(Arc::new(suite) as Arc<dyn TaskSuite>)
        });
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

    /// Adds (or replaces) the suite `name`, loaded by `factory` when a run opens.
    pub fn register_suite(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn() -> Result<Arc<dyn TaskSuite>, SuiteError> + Send + Sync + 'static,
    ) -> &mut Self {
        self.suites.insert(name.into(), Arc::new(factory));
        self
    }

    /// The registered judge names, sorted.
    pub fn judge_names(&self) -> Vec<&str> {
        self.judges.keys().map(String::as_str).collect()
    }

    /// The registered suite names, sorted.
    pub fn suite_names(&self) -> Vec<&str> {
        self.suites.keys().map(String::as_str).collect()
    }

    /// Checks that `name` is a registered judge, without building it.
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

    /// Checks that `name` is a registered suite, without loading it.
    ///
    /// # Errors
    /// [`RegistryError::UnknownSuite`], listing the registered names.
    pub fn check_suite(&self, name: &str) -> Result<(), RegistryError> {
        if self.suites.contains_key(name) {
            Ok(())
        } else {
            Err(RegistryError::UnknownSuite {
                name: name.to_string(),
                known: self.suite_names().join(", "),
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

    /// Loads the suite `name` for a run.
    ///
    /// # Errors
    /// [`SuiteError::Unregistered`] (naming the registered suites), or the suite's own error.
    pub fn suite(&self, name: &str) -> Result<Arc<dyn TaskSuite>, SuiteError> {
        self.check_suite(name)?;
        (self.suites[name])()
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

    #[test]
    fn the_builtin_suite_is_registered_and_unknown_names_list_it() {
        let r = Registry::builtin();
        assert_eq!(r.suite_names(), ["bfcl_base"]);
        assert!(r.check_suite("bfcl_base").is_ok());
        assert_eq!(
            r.check_suite("webshop").unwrap_err().to_string(),
            "environment = \"webshop\" is not registered; registered environments: bfcl_base"
        );
        assert!(Registry::empty().suite_names().is_empty());
    }
}
