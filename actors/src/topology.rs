//! A topology: the actors of one run, started under one supervisor around one model thread.
//!
//! `src/` builds it from the TOML config; users can build their own from these parts (see
//! `examples/custom_topology.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ractor::{Actor, ActorRef};

use crate::engine_actor::{EngineActor, EngineMsg};
use crate::env_actor::{EnvArgs, EnvFactory, EnvMsg, EnvironmentActor};
use crate::episode::{Agents, ObservationSource};
use crate::judge::{Judge, PassThroughJudge};
use crate::judge_actor::{JudgeActor, JudgeMsg};
use crate::learner_actor::{LearnerActor, LearnerArgs, LearnerMsg};
use crate::memory_actor::{MemoryActor, MemoryMsg};
use crate::policy::{PolicyActor, PolicyArgs, PolicyMsg};
use crate::protocol::{protocol_for, PromptKit, Protocol, ProtocolConfig, ProtocolError};
use crate::slot::{ActorCallError, Pool, Slot};
use crate::storage::Store;
use crate::supervisor::{start_child, StartError, Supervisor, SupervisorArgs, SupervisorMsg};
use crate::worker::WorkerHandle;

/// How many workers of each kind to start (`[topology]` in a run config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopologySpec {
    /// Policy workers: concurrent generation calls (Act turns and Rehearse calls) in flight
    /// towards the Engine, which batches them. Default 4.
    pub policy_workers: usize,
    /// Restarts allowed per actor before it stays down. Default 10.
    pub max_restarts: u32,
    /// Wait before an actor's first restart, in milliseconds; doubled per further failure of
    /// the same actor (at most 10 s). Default 100.
    pub restart_backoff_ms: u64,
    /// Longest wait, in seconds, for a generation (Engine, Policy) or learner reply; past it
    /// the request is an error ([`crate::slot::ActorCallError::Timeout`]), never a hang.
    /// `None`: no limit. Default 1800 (a learner step on a large batch takes minutes on CPU).
    pub request_timeout_s: Option<u64>,
}

impl Default for TopologySpec {
    fn default() -> Self {
        Self {
            policy_workers: 4,
            max_restarts: 10,
            restart_backoff_ms: 100,
            request_timeout_s: Some(1800),
        }
    }
}

impl TopologySpec {
    /// [`TopologySpec::request_timeout_s`] as a duration (`None`, or 0, for no limit).
    pub fn request_timeout(&self) -> Option<std::time::Duration> {
        self.request_timeout_s
            .filter(|s| *s > 0)
            .map(std::time::Duration::from_secs)
    }
}

/// Why a topology could not start.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The protocol cannot be built over the model's chat template.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// A spec value is out of range (the message names it).
    #[error("topology: {0}")]
    Invalid(String),
    /// An actor failed to start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// Real-environment agents were asked of a topology started without an environment.
    #[error("this topology has no environment actor")]
    NoEnvironment,
}

/// Builds and starts a [`Topology`]: the model thread, tokenizer and store are required; the
/// rest has defaults (4 Policy workers, the pass-through judge, no environment, the reference
/// protocol with full tool rendering).
///
/// ```no_run
/// # async fn f(worker: envace_actors::worker::WorkerHandle,
/// #            kit: std::sync::Arc<envace_actors::protocol::PromptKit>,
/// #            store: std::sync::Arc<envace_actors::storage::Store>,
/// #            judge: std::sync::Arc<dyn envace_actors::Judge>)
/// #            -> Result<(), envace_actors::topology::TopologyError> {
/// use envace_actors::topology::TopologyBuilder;
/// let topology = TopologyBuilder::new(worker, kit, store)
///     .policy_workers(2)
///     .judge(judge)
///     .start()
///     .await?;
/// # Ok(()) }
/// ```
pub struct TopologyBuilder {
    spec: TopologySpec,
    worker: WorkerHandle,
    kit: Arc<PromptKit>,
    store: Arc<Store>,
    judge: Arc<dyn Judge>,
    environment: Option<EnvFactory>,
    protocol: ProtocolChoice,
}

/// What [`TopologyBuilder::start`] builds its protocol from.
enum ProtocolChoice {
    /// A protocol the caller built.
    Given(Arc<dyn Protocol>),
    /// A `[protocol]` section, built over the builder's kit at start.
    Config(ProtocolConfig),
}

impl TopologyBuilder {
    /// A builder around the model thread `worker`, its tokenizer and template `kit`, and the
    /// sled `store` the Memory actor serves.
    pub fn new(worker: WorkerHandle, kit: Arc<PromptKit>, store: Arc<Store>) -> Self {
        Self {
            spec: TopologySpec::default(),
            worker,
            kit,
            store,
            judge: Arc::new(PassThroughJudge),
            environment: None,
            protocol: ProtocolChoice::Config(ProtocolConfig::default()),
        }
    }

    /// Worker counts and restart budget from a config's `[topology]`.
    pub fn spec(mut self, spec: TopologySpec) -> Self {
        self.spec = spec;
        self
    }

    /// Policy workers (at least 1).
    pub fn policy_workers(mut self, n: usize) -> Self {
        self.spec.policy_workers = n;
        self
    }

    /// Restarts allowed per actor.
    pub fn max_restarts(mut self, n: u32) -> Self {
        self.spec.max_restarts = n;
        self
    }

    /// The judge of self-rehearsal episodes (hosted by the Judge actor).
    pub fn judge(mut self, judge: Arc<dyn Judge>) -> Self {
        self.judge = judge;
        self
    }

    /// A real environment (an Environment actor making one instance per episode).
    pub fn environment(mut self, factory: EnvFactory) -> Self {
        self.environment = Some(factory);
        self
    }

    /// The protocol every episode's prompts follow.
    pub fn protocol(mut self, protocol: Arc<dyn Protocol>) -> Self {
        self.protocol = ProtocolChoice::Given(protocol);
        self
    }

    /// The protocol a config's `[protocol]` section selects ([`protocol_for`]), built over
    /// this builder's kit when the topology starts.
    pub fn protocol_config(mut self, cfg: &ProtocolConfig) -> Self {
        self.protocol = ProtocolChoice::Config(cfg.clone());
        self
    }

    /// Starts the supervisor, then the Engine, Policy, Judge, Learner, Memory and (when
    /// given) Environment actors under it.
    ///
    /// # Errors
    /// [`TopologyError::Invalid`] for zero Policy workers; [`TopologyError::Protocol`] when the
    /// protocol cannot be built over the chat template; [`TopologyError::Start`] naming the
    /// actor that failed to start.
    pub async fn start(self) -> Result<Topology, TopologyError> {
        let Self {
            spec,
            worker,
            kit,
            store,
            judge,
            environment,
            protocol,
        } = self;
        if spec.policy_workers == 0 {
            return Err(TopologyError::Invalid(
                "policy_workers must be at least 1".into(),
            ));
        }
        let protocol = match protocol {
            ProtocolChoice::Given(p) => p,
            ProtocolChoice::Config(cfg) => protocol_for(&cfg, kit.clone())?,
        };
        let (supervisor, _) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                max_restarts: spec.max_restarts,
                restart_backoff: std::time::Duration::from_millis(spec.restart_backoff_ms),
            },
        )
        .await
        .map_err(|e| StartError::Spawn {
            actor: "supervisor".into(),
            reason: e.to_string(),
        })?;
        let w = worker.clone();
        let engine = start_child(
            &supervisor,
            "engine",
            EngineActor,
            Arc::new(move || w.clone()),
        )
        .await?
        .with_timeout(spec.request_timeout());
        let info = worker.info();
        let mut policy = Vec::new();
        for i in 0..spec.policy_workers {
            let args = PolicyArgs {
                engine: engine.clone(),
                kit: kit.clone(),
                info,
            };
            let name = format!("policy-{i}");
            policy.push(
                start_child(
                    &supervisor,
                    &name,
                    PolicyActor,
                    Arc::new(move || args.clone()),
                )
                .await?
                .with_timeout(spec.request_timeout()),
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
        .await?
        .with_timeout(spec.request_timeout());
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
        Ok(Topology {
            supervisor,
            worker,
            kit,
            engine,
            policy: Arc::new(Pool::new(policy)),
            protocol,
            environment,
            judge,
            learner,
            memory,
            env_calls,
        })
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
    /// Generation calls of both roles (round-robin).
    pub policy: Arc<Pool<PolicyMsg>>,
    /// The protocol episodes follow.
    pub protocol: Arc<dyn Protocol>,
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
    /// Starts one more Judge actor hosting `judge` (e.g. the real-environment checker for
    /// evaluation) under the same supervisor.
    ///
    /// # Errors
    /// [`StartError`] when it cannot start.
    pub async fn start_judge(
        &self,
        name: &str,
        judge: Arc<dyn Judge>,
    ) -> Result<Slot<JudgeMsg>, StartError> {
        self.start_actor(name, JudgeActor, move || judge.clone())
            .await
    }

    /// Starts a user's own actor under the topology's supervisor: when it fails it is
    /// restarted (with arguments from `args`, up to the topology's `max_restarts`) and the
    /// returned slot serves the replacement, as for the built-in actors.
    ///
    /// # Errors
    /// [`StartError`] naming `name` when it cannot start.
    pub async fn start_actor<A: Actor + Clone>(
        &self,
        name: &str,
        actor: A,
        args: impl Fn() -> A::Arguments + Send + Sync + 'static,
    ) -> Result<Slot<A::Msg>, StartError> {
        start_child(&self.supervisor, name, actor, Arc::new(args)).await
    }

    /// The actors the supervisor stopped restarting (their restart limit reached).
    ///
    /// # Errors
    /// The supervisor is gone.
    pub async fn gave_up(&self) -> Result<Vec<crate::supervisor::GaveUp>, ActorCallError> {
        match self.supervisor.call(SupervisorMsg::GaveUp, None).await {
            Ok(ractor::rpc::CallResult::Success(v)) => Ok(v),
            Ok(_) => Err(ActorCallError::Stopped {
                what: "supervisor".into(),
                id: self.supervisor.get_id().to_string(),
            }),
            Err(e) => Err(ActorCallError::Unreachable {
                what: "supervisor".into(),
                id: self.supervisor.get_id().to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// The agents of a self-rehearsal episode (no environment).
    pub fn rehearsal_agents(&self) -> Agents {
        Agents {
            policy: self.policy.clone(),
            observations: ObservationSource::Rehearsal,
            judge: self.judge.clone(),
            protocol: self.protocol.clone(),
        }
    }

    /// The agents of a real-environment episode judged by `judge`.
    ///
    /// # Errors
    /// [`TopologyError::NoEnvironment`] when the topology was started without one.
    pub fn real_agents(&self, judge: Slot<JudgeMsg>) -> Result<Agents, TopologyError> {
        let env = self
            .environment
            .clone()
            .ok_or(TopologyError::NoEnvironment)?;
        Ok(Agents {
            policy: self.policy.clone(),
            observations: ObservationSource::Real(env),
            judge,
            protocol: self.protocol.clone(),
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

    /// Stops every actor, children first, and waits until each has stopped and dropped its
    /// state (the store, the model handle): at most `timeout` for the children and as much for
    /// the supervisor. When it returns, nothing of this topology holds the store any more.
    pub async fn shutdown(&self, timeout: std::time::Duration) {
        self.supervisor
            .stop_children_and_wait(None, Some(timeout))
            .await;
        if let Err(e) = self.supervisor.stop_and_wait(None, Some(timeout)).await {
            tracing::warn!(error = %e, "the supervisor did not stop in time");
        }
    }
}
