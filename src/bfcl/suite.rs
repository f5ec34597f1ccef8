//! BFCL `multi_turn_base` as a [`TaskSuite`]: its fixed split, [`BfclEnv`] as the real
//! environment, the ground-truth replay as seed collection and BFCL's own checker as the
//! evaluation judge.

use std::sync::Arc;

use envace_actors::env_actor::EnvFactory;
use envace_actors::environment::Environment;
use envace_actors::{EpisodeTask, Judge, Split};
use envace_storage::records::Task;

use super::env::BfclEnv;
use super::episode::{collect_seed, BfclSuite};
use super::tasks::id_index;
use crate::suite::{CollectedSeed, SuiteError, TaskSuite};

/// The suite's name in the config (`environment = "bfcl_base"`) and the registry.
pub const BFCL_BASE: &str = "bfcl_base";

impl TaskSuite for BfclSuite {
    fn name(&self) -> &str {
        BFCL_BASE
    }

    fn tasks(&self, split: Split) -> &[EpisodeTask] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    fn environment(&self) -> EnvFactory {
        let docs = self.docs.clone();
        Arc::new(move || Box::new(BfclEnv::new(docs.clone())) as Box<dyn Environment>)
    }

    fn collect_seed(
        &self,
        task: &EpisodeTask,
        env: &mut dyn Environment,
    ) -> Result<CollectedSeed, SuiteError> {
        let bfcl = self
            .task(&task.id.0)
            .ok_or_else(|| SuiteError::UnknownTask {
                suite: BFCL_BASE.into(),
                task: task.id.0.clone(),
            })?;
        collect_seed(bfcl, env).map_err(|e| SuiteError::Collect {
            task: task.id.0.clone(),
            source: Box::new(e),
        })
    }

    fn evaluation_judge(&self) -> Arc<dyn Judge> {
        Arc::new(self.checker_judge(Default::default()))
    }

    /// The task's stratum of [`super::split::ScenarioSplit`] (its classes joined by `+`).
    fn stratum(&self, task: &EpisodeTask) -> Option<String> {
        let index = id_index(&task.id.0)?;
        self.split
            .strata
            .iter()
            .find(|(_, s)| s.train.contains(&index) || s.test.contains(&index))
            .map(|(key, _)| key.clone())
    }

    /// The API class whose function `tool` is, among the task's involved classes.
    fn tool_group(&self, task: &EpisodeTask, tool: &str) -> Option<String> {
        let bfcl = self.task(&task.id.0)?;
        self.docs
            .find(&bfcl.involved_classes, tool)
            .map(|d| d.class.clone())
    }

    /// Stored with BFCL's category name, `multi_turn_base`.
    fn stored_task(&self, task: &EpisodeTask) -> Task {
        Task {
            id: task.id.clone(),
            category: "multi_turn_base".into(),
            split: task.split.name().into(),
            payload_json: task.env.spec.to_string(),
        }
    }
}
