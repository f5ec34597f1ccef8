//! Rehearse fidelity: how well the policy's internal world model predicts real tool results.
//!
//! For each evaluated task, its ground truth is replayed in the real environment (a seed
//! trajectory made for evaluation only: never stored, never trained on, never a few-shot fact),
//! and each of its real calls (at most `eval.fidelity_calls_per_task`, in call order) is put to
//! the Rehearse role exactly as a rollout would: the same prompt in the run's protocol (the
//! replay's rows, [`super::seed_rows`], made by the transcript a rollout uses), few-shot facts
//! from *train* seeds of the same tools only, through the Policy actor and the protocol's
//! parser. Generation is greedy (the world model's most likely answer), with the
//! rollouts' Rehearse token budget.
//!
//! Each prediction is compared with the real result in the form the protocol trains on (a
//! JSON object or array; anything else wrapped as `{"result": …}`):
//!
//! * **valid JSON**: the output parses in the protocol's format as an object or array;
//! * **same keys**: it has the real result's shape — an object with the same key set, or an
//!   array of the same length;
//! * **equal values**: it equals the real result (JSON equality, `1 == 1.0`).
//!
//! Each is reported overall with a bootstrap interval over tasks, and as counts per API class.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{anyhow, Result};
use serde_json::Value;

use super::seed_rows::seed_rows;
use super::{secs, Pipeline};
use crate::actors::policy::{PolicyMsg, PolicyRequest, PolicyTurn};
use crate::actors::protocol::{canonical_result, Protocol, RolePrompt};
use crate::actors::slot::Pool;
use crate::actors::EpisodeTask;
use crate::bfcl::judge::json_eq;
use crate::kernels::SamplingParams;
use crate::report::{FidelityCall, FidelityReport};
use crate::stats::{bootstrap, PerTask};
use crate::storage::{Role, ToolExchange};

/// The three checks of the module doc for one prediction (`None`: it did not parse).
pub fn compare(predicted: Option<&Value>, real_result: &str) -> (bool, bool, bool) {
    let Some(predicted) = predicted else {
        return (false, false, false);
    };
    let real: Value = serde_json::from_str(&canonical_result(real_result)).unwrap_or(Value::Null);
    let same_shape = match (predicted, &real) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.keys().all(|k| b.contains_key(k))
        }
        (Value::Array(a), Value::Array(b)) => a.len() == b.len(),
        _ => false,
    };
    (true, same_shape, same_shape && json_eq(predicted, &real))
}

/// The first `max` characters of `text` (with `…` when cut).
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max).collect::<String>())
    } else {
        text.to_string()
    }
}

/// One real call to put to the Rehearse role, with what it is compared against.
pub struct FidelityRequest {
    /// The task the call is from, and the API class of the called function.
    pub task: String,
    pub class: String,
    /// The real call and its real result.
    pub exchange: ToolExchange,
    /// The Rehearse prompt for it, as a rollout would send it.
    pub prompt: RolePrompt,
}

/// Sends every request to the Policy workers (concurrently, sampled with `params`), reads each
/// output with `protocol`'s Rehearse parser and compares it with its real result
/// ([`compare`]); returns the calls sorted by task (a call's position among its task's calls
/// is kept) and the tokens processed.
///
/// # Errors
/// A Policy actor that is gone or fails (a model-thread error).
pub async fn predict_results(
    policy: &Pool<PolicyMsg>,
    protocol: &dyn Protocol,
    params: &SamplingParams,
    requests: Vec<FidelityRequest>,
) -> Result<(Vec<FidelityCall>, u64)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, r) in requests.into_iter().enumerate() {
        let worker = policy.pick().clone();
        let request = PolicyRequest {
            role: Role::Rehearse,
            prompt: r.prompt,
            params: params.clone(),
        };
        set.spawn(async move {
            let turn = worker
                .ask("policy", |reply| PolicyMsg::Generate(request, reply))
                .await;
            (i, r.task, r.class, r.exchange, turn)
        });
    }
    let mut out = Vec::new();
    let mut tokens = 0u64;
    for (i, task, class, real, turn) in set.join_all().await {
        let turn = turn
            .map_err(|e| anyhow!("fidelity: {e}"))?
            .map_err(|e| anyhow!("fidelity: {e}"))?;
        let (text, parsed) = match turn {
            PolicyTurn::Generated { row, text } => {
                tokens += (row.prompt_ids.len() + row.completion_ids.len()) as u64;
                let parsed = protocol.parse_rehearse(&text).ok();
                (text, parsed)
            }
            PolicyTurn::LengthExceeded { prompt_tokens } => (
                format!("(prompt of {prompt_tokens} tokens exceeds the context)"),
                None,
            ),
        };
        let (valid, keys, equal) = compare(parsed.as_ref(), &real.result_json);
        out.push((
            i,
            FidelityCall {
                task,
                tool: real.name,
                class,
                valid_json: valid,
                same_keys: keys,
                equal_values: equal,
                predicted: clip(text.trim(), 300),
                real: clip(&real.result_json, 300),
            },
        ));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok((out.into_iter().map(|(_, c)| c).collect(), tokens))
}

/// The report of `per_call`: the three rates with their bootstrap intervals over tasks, and
/// counts per class (`real_env_calls`, `tokens` and `wall_s` are left for the caller).
pub fn summarize(per_call: Vec<FidelityCall>) -> FidelityReport {
    let mut report = FidelityReport::default();
    let mut by_task: BTreeMap<&str, [PerTask; 3]> = BTreeMap::new();
    for c in &per_call {
        let e = by_task
            .entry(c.task.as_str())
            .or_insert([PerTask::new(0.0, 0.0); 3]);
        for (slot, hit) in e
            .iter_mut()
            .zip([c.valid_json, c.same_keys, c.equal_values])
        {
            slot.num += f64::from(u8::from(hit));
            slot.den += 1.0;
        }
        let k = report.per_class.entry(c.class.clone()).or_default();
        k.calls += 1;
        k.valid_json += u64::from(c.valid_json);
        k.same_keys += u64::from(c.same_keys);
        k.equal_values += u64::from(c.equal_values);
    }
    let column = |i: usize| by_task.values().map(|v| v[i]).collect::<Vec<_>>();
    report.valid_json = bootstrap(&column(0), 0);
    report.same_keys = bootstrap(&column(1), 0);
    report.equal_values = bootstrap(&column(2), 0);
    report.calls = per_call.len() as u64;
    report.tasks = by_task.len() as u64;
    report.per_call = per_call;
    report
}

impl Pipeline {
    /// Rehearse fidelity on the real calls of `tasks` (see the module doc).
    ///
    /// # Errors
    /// A task without ground truth, a replay the environment refuses, a seed whose rows
    /// cannot be built, or a Policy actor that is gone.
    pub async fn fidelity(
        &self,
        tasks: &[EpisodeTask],
        per_task: Option<usize>,
    ) -> Result<FidelityReport> {
        let start = Instant::now();
        let pool = self.seed_pool().await?;
        let mut env = (self.suite.environment())();
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: self.cfg.rollout.rehearse_max_new_tokens,
            ..SamplingParams::default()
        };
        let mut requests = Vec::new();
        let mut real_env_calls = 0u64;
        for task in tasks {
            let replay = self.suite.collect_seed(task, env.as_mut())?;
            real_env_calls += replay.env_calls as u64;
            let rows = seed_rows(
                &self.topology.kit,
                self.topology.protocol.as_ref(),
                task,
                &replay.seed,
                &pool,
                &self.cfg,
            )?;
            let calls = rows
                .into_iter()
                .filter(|r| r.role == Role::Rehearse)
                .filter_map(|r| r.call.map(|c| (r.row, c)))
                .take(per_task.unwrap_or(usize::MAX));
            for (row, call) in calls {
                let class = self
                    .suite
                    .tool_group(task, &call.call.name)
                    .unwrap_or_else(|| "unknown".to_string());
                requests.push(FidelityRequest {
                    task: task.id.0.clone(),
                    class,
                    exchange: call.exchange,
                    prompt: RolePrompt {
                        ids: row.prompt_ids,
                        stop_strings: call.stop_strings,
                    },
                });
            }
        }
        let (per_call, tokens) = predict_results(
            &self.topology.policy,
            self.topology.protocol.as_ref(),
            &params,
            requests,
        )
        .await?;
        let mut report = summarize(per_call);
        report.real_env_calls = real_env_calls;
        report.tokens = tokens;
        report.wall_s = secs(start);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn valid_same_keys_equal_values() {
        let real = r#"{"current_working_directory": "docs", "n": 1}"#;
        assert_eq!(compare(None, real), (false, false, false));
        let v = json!({"current_working_directory": "docs", "n": 1.0});
        assert_eq!(compare(Some(&v), real), (true, true, true));
        let v = json!({"n": 2, "current_working_directory": "docs"});
        assert_eq!(compare(Some(&v), real), (true, true, false));
        let v = json!({"cwd": "docs", "n": 1});
        assert_eq!(compare(Some(&v), real), (true, false, false));
        // Arrays: the same length is the same shape.
        assert_eq!(
            compare(Some(&json!(["a", "b"])), r#"["a", "c"]"#),
            (true, true, false)
        );
        assert_eq!(
            compare(Some(&json!(["a"])), r#"["a", "c"]"#),
            (true, false, false)
        );
        // A result that is not JSON is compared in the wrapped form the protocol trains on.
        let wrapped = json!({"result": "cd: temp: No such directory"});
        assert_eq!(
            compare(Some(&wrapped), "cd: temp: No such directory"),
            (true, true, true)
        );
        assert_eq!(
            compare(Some(&json!({"result": 1})), "None"),
            (true, true, false)
        );
    }
}
