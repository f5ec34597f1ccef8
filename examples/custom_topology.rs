//! A custom topology built with the public API instead of a TOML file: one model thread, four
//! Policy workers, a custom judge, the reference protocol with compact tool schemas, no
//! environment actor at all (so no real environment call is even possible); then K
//! self-rehearsal episodes of one BFCL train task and one role-wise GRPO step on them.
//!
//! `cargo run --release --example custom_topology` (after `make setup`; `smollm2-135m` as first
//! argument uses the embedded model instead of the tiny random one).

use std::sync::Arc;

use envace::actors::episode::{run_episode_supervised, EpisodeConfig, EpisodeSpec};
use envace::actors::learner_actor::LearnerMsg;
use envace::actors::protocol::{PromptKit, ProtocolConfig, SeedPool, ToolRendering};
use envace::actors::topology::TopologyBuilder;
use envace::actors::worker::WorkerHandle;
use envace::actors::{Judge, JudgeTask, Split, TurnCalls, Verdict};
use envace::bfcl::env::BfclEnv;
use envace::bfcl::episode::{collect_seed, BfclSuite};
use envace::bfcl::judge::RuleChecklistJudge;
use envace::kernels::{load, EngineConfig, ModelSource};
use envace::storage::{RunId, Store, StoreOptions};

/// The rule checklist, with a bonus-free twist: a trajectory that never reached a final answer
/// scores 0 even where some items matched.
struct FinishedOnlyJudge;

impl Judge for FinishedOnlyJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        if transcript.iter().all(|t| t.final_answer) {
            RuleChecklistJudge.judge(task, transcript)
        } else {
            Verdict::from_turn_scores(
                RuleChecklistJudge
                    .judge(task, transcript)
                    .turn_scores
                    .into_iter()
                    .map(|mut s| {
                        s.score = 0.0;
                        s
                    })
                    .collect(),
            )
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "tiny".into());
    let (device, dtype) = envace::runtime::resolve(Default::default(), Default::default())?;
    let loaded = load(&ModelSource::parse(&spec), device, dtype)?;
    let kit = Arc::new(PromptKit::new(
        loaded.tokenizer.clone(),
        loaded.chat_template,
    )?);
    let worker = WorkerHandle::spawn(loaded.model, loaded.tokenizer, EngineConfig::default());
    let dir = std::env::temp_dir().join(format!("envace-custom-topology-{}", std::process::id()));
    let store = Arc::new(Store::open(dir.join("db"), StoreOptions::default())?);
    let topology = TopologyBuilder::new(worker, kit, store)
        .policy_workers(4)
        .max_restarts(3)
        .judge(Arc::new(FinishedOnlyJudge))
        .protocol_config(&ProtocolConfig {
            tool_rendering: ToolRendering::Compact,
            ..ProtocolConfig::default()
        })
        .start()
        .await?;

    // Few-shot facts for Rehearse from the task's own seed (a train task).
    let suite = BfclSuite::load_base()?;
    let task = Arc::new(suite.train[0].clone());
    let bfcl = suite.task(&task.id.0).ok_or("task missing")?;
    let seed = collect_seed(bfcl, &mut BfclEnv::new(suite.docs.clone()))?.seed;
    let facts = SeedPool::new(vec![(Split::Train, seed)]).facts_for(&task, 4, 200);

    let cfg = EpisodeConfig {
        max_user_turns: Some(1),
        act_max_new_tokens: 48,
        rehearse_max_new_tokens: 48,
        ..EpisodeConfig::default()
    };
    let agents = topology.rehearsal_agents();
    let mut episodes = Vec::new();
    for sample in 0..4 {
        let spec = EpisodeSpec {
            task: task.clone(),
            facts: Arc::new(facts.clone()),
            memory: None,
            run: RunId::from("custom"),
            step: 0,
            sample,
            seed: u64::from(sample),
        };
        let (agents, cfg) = (agents.clone(), cfg.clone());
        episodes.push(tokio::spawn(async move {
            run_episode_supervised(&agents, &cfg, &spec).await
        }));
    }
    let mut trajectories = Vec::new();
    for e in episodes {
        let t = e.await?;
        println!(
            "sample {}: {:?}, reward {:.2}, {} rows",
            t.sample,
            t.termination,
            t.reward,
            t.rows.len()
        );
        trajectories.push(t);
    }
    topology
        .learner
        .ask("learner", |r| LearnerMsg::Configure(Box::default(), r))
        .await??;
    match topology
        .learner
        .ask("learner", |r| LearnerMsg::GrpoStep(trajectories, r))
        .await?
    {
        Ok(step) => println!(
            "GRPO step: loss {:.4}, {} tokens, policy version {}",
            step.stats.loss, step.stats.tokens, step.policy_version.0
        ),
        Err(e) => println!("GRPO step skipped: {e}"),
    }
    println!("real environment calls: {}", topology.real_env_calls());
    topology.stop();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
