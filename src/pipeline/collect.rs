//! `collect`: replays the reference solutions of the train split in the suite's real
//! environment ([`crate::suite::TaskSuite::collect_seed`]) and stores the seed trajectories
//! (with real observations) in sled. Test tasks never get a seed.

use std::time::Instant;

use anyhow::Result;

use super::{progress, secs, Pipeline};
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::Split;
use crate::report::StageReport;
use crate::storage::Task;

impl Pipeline {
    /// Collects seeds for the train split (at most `collect.tasks` tasks) and stores every
    /// task of both splits in sled.
    ///
    /// # Errors
    /// A task whose ground truth does not replay, or the store fails.
    pub async fn collect(&mut self) -> Result<StageReport> {
        let start = Instant::now();
        let limit = self.cfg.collect.tasks.unwrap_or(usize::MAX);
        let train: Vec<_> = self.suite.tasks(Split::Train).iter().take(limit).collect();
        let bar = progress(train.len() as u64, "collect");
        let mut env = (self.suite.environment())();
        let mut seeds = Vec::with_capacity(train.len());
        let mut calls = 0u64;
        for task in &train {
            let collected = self.suite.collect_seed(task, env.as_mut())?;
            calls += collected.env_calls as u64;
            seeds.push(collected.seed);
            bar.inc(1);
        }
        bar.finish_and_clear();
        metrics::counter!("seed_env_calls").increment(calls);
        let tasks: Vec<Task> = [Split::Train, Split::Test]
            .into_iter()
            .flat_map(|split| self.suite.tasks(split))
            .map(|t| self.suite.stored_task(t))
            .collect();
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTasks(tasks, r))
            .await??;
        let n = seeds.len() as u64;
        self.memory()
            .ask("memory", |r| MemoryMsg::PutSeeds(seeds, r))
            .await??;
        let stage = StageReport {
            wall_s: secs(start),
            tokens: 0,
            generated_tokens: 0,
            real_env_calls: calls,
            items: n,
        };
        eprintln!("collect: {n} seed trajectories from the train split, {calls} real env calls");
        self.record_stage("collect", stage.clone());
        Ok(stage)
    }
}
