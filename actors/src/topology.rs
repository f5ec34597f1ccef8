//! A topology: the actors of one run, started under one supervisor around one model thread.
//!
//! `src/` builds it from the TOML config; users can build their own from these parts (see
//! `examples/custom_topology.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ractor::{Actor, ActorRef};

use crate::acting::{ActingActor, ActingArgs, ActingMsg};
use crate::engine::{EngineActor, EngineMsg};
use crate::env_actor::{EnvArgs, EnvFactory, EnvMsg, EnvironmentActor};
use crate::episode::{Agents, ObservationSource};
use crate::judge::Judge;
use crate::judge_actor::{JudgeActor, JudgeMsg};
use crate::learner::{LearnerActor, LearnerArgs, LearnerMsg};
use crate::memory::{MemoryActor, MemoryMsg};
use crate::protocol::PromptKit;
use crate::rehearsal::{RehearsalActor, RehearsalArgs, RehearsalMsg};
use crate::slot::{Pool, Slot};
use crate::storage::Store;
use crate::supervisor::{start_child, Supervisor, SupervisorArgs, SupervisorMsg};
use crate::worker::WorkerHandle;

/// How many workers of each kind to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopologySpec {
    /// Acting workers (concurrent Act prompts being rendered and parsed).
    pub acting_workers: usize,
    /// Rehearsal workers.
    pub rehearsal_workers: usize,
    /// Restarts allowed per actor before it stays down.
    pub max_restarts: u32,
}

impl Default for TopologySpec {
    fn default() -> Self {
        Self {
            acting_workers: 2,
            rehearsal_workers: 2,
            max_restarts: 10,
        }
    }
}

/// The running actors of one run.
pub struct Topology {
    /// Restarts failed actors.
    pub supervisor: ActorRef<SupervisorMsg>,
    /// The model thread (the one shared model handle).
    pub worker: WorkerHandle,
    /// Tokenizer and chat template.
    pub kit: Arc<PromptKit>,
    /// Generation and scoring requests.
    pub engine: Slot<EngineMsg>,
    /// Act turns.
    pub acting: Arc<Pool<ActingMsg>>,
    /// Rehearse calls.
    pub rehearsal: Arc<Pool<RehearsalMsg>>,
    /// The real environment, when the topology has one.
    pub environment: Option<Slot<EnvMsg>>,
    /// The judge of self-rehearsal episodes.
    pub judge: Slot<JudgeMsg>,
    /// Role-wise GRPO and warm-up steps.
    pub learner: Slot<LearnerMsg>,
    /// The sled store.
    pub memory: Slot<MemoryMsg>,
    env_calls: Arc<AtomicU64>,
}

impl Topology {
    /// Starts the supervisor, then the Engine, Acting, Rehearsal, Judge (hosting `judge`),
    /// Learner, Memory (over `store`) and, when `environment` is given, Environment actors.
    ///
    /// # Errors
    /// A message naming the actor that failed to start.
    pub async fn start(
        spec: TopologySpec,
        worker: WorkerHandle,
        kit: Arc<PromptKit>,
        judge: Arc<dyn Judge>,
        environment: Option<EnvFactory>,
        store: Arc<Store>,
    ) -> Result<Self, String> {
        if spec.acting_workers == 0 || spec.rehearsal_workers == 0 {
            return Err("topology: acting_workers and rehearsal_workers must be at least 1".into());
        }
        let (supervisor, _) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                max_restarts: spec.max_restarts,
            },
        )
        .await
        .map_err(|e| format!("starting the supervisor: {e}"))?;
        let w = worker.clone();
        let engine = start_child(
            &supervisor,
            "engine",
            EngineActor,
            Arc::new(move || w.clone()),
        )
        .await?;
        let info = worker.info();
        let mut acting = Vec::new();
        for i in 0..spec.acting_workers {
            let args = ActingArgs {
                engine: engine.clone(),
                kit: kit.clone(),
                info,
            };
            let name = format!("acting-{i}");
            acting.push(
                start_child(
                    &supervisor,
                    &name,
                    ActingActor,
                    Arc::new(move || args.clone()),
                )
                .await?,
            );
        }
        let mut rehearsal = Vec::new();
        for i in 0..spec.rehearsal_workers {
            let args = RehearsalArgs {
                engine: engine.clone(),
                kit: kit.clone(),
                info,
            };
            let name = format!("rehearsal-{i}");
            rehearsal.push(
                start_child(
                    &supervisor,
                    &name,
                    RehearsalActor,
                    Arc::new(move || args.clone()),
                )
                .await?,
            );
        }
        let judge = start_child(
            &supervisor,
            "judge",
            JudgeActor,
            Arc::new(move || judge.clone()),
        )
        .await?;
        let learner_args = LearnerArgs::new(worker.clone(), kit.eos_id().into_iter().collect());
        let learner = start_child(
            &supervisor,
            "learner",
            LearnerActor,
            Arc::new(move || learner_args.clone()),
        )
        .await?;
        let memory = start_child(
            &supervisor,
            "memory",
            MemoryActor,
            Arc::new(move || store.clone()),
        )
        .await?;
        let env_calls = Arc::new(AtomicU64::new(0));
        let environment = match environment {
            Some(factory) => {
                let args = EnvArgs {
                    factory,
                    calls: env_calls.clone(),
                };
                Some(
                    start_child(
                        &supervisor,
                        "environment",
                        EnvironmentActor,
                        Arc::new(move || args.clone()),
                    )
                    .await?,
                )
            }
            None => None,
        };
        Ok(Self {
            supervisor,
            worker,
            kit,
            engine,
            acting: Arc::new(Pool::new(acting)),
            rehearsal: Arc::new(Pool::new(rehearsal)),
            environment,
            judge,
            learner,
            memory,
            env_calls,
        })
    }

    /// Starts one more Judge actor hosting `judge` (e.g. the real-environment checker for
    /// evaluation) under the same supervisor.
    ///
    /// # Errors
    /// A message when it cannot start.
    pub async fn start_judge(
        &self,
        name: &str,
        judge: Arc<dyn Judge>,
    ) -> Result<Slot<JudgeMsg>, String> {
        start_child(
            &self.supervisor,
            name,
            JudgeActor,
            Arc::new(move || judge.clone()),
        )
        .await
    }

    /// The agents of a self-rehearsal episode (no environment).
    pub fn rehearsal_agents(&self) -> Agents {
        Agents {
            acting: self.acting.clone(),
            observations: ObservationSource::Rehearsal(self.rehearsal.clone()),
            judge: self.judge.clone(),
            kit: Some(self.kit.clone()),
        }
    }

    /// The agents of a real-environment episode judged by `judge`.
    ///
    /// # Errors
    /// When the topology was started without an environment.
    pub fn real_agents(&self, judge: Slot<JudgeMsg>) -> Result<Agents, String> {
        let env = self
            .environment
            .clone()
            .ok_or("this topology has no environment actor")?;
        Ok(Agents {
            acting: self.acting.clone(),
            observations: ObservationSource::Real(env),
            judge,
            kit: Some(self.kit.clone()),
        })
    }

    /// Real environment calls executed so far by this topology's Environment actor.
    pub fn real_env_calls(&self) -> u64 {
        self.env_calls.load(Ordering::SeqCst)
    }

    /// Restarts so far (all actors).
    pub async fn restarts(&self) -> u64 {
        ractor::call!(self.supervisor, SupervisorMsg::Restarts).unwrap_or(0)
    }

    /// Stops every actor (children first, by the supervisor's stop).
    pub fn stop(&self) {
        self.supervisor.stop_children(None);
        self.supervisor.stop(None);
    }
}
