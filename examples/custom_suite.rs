//! A task suite of your own: implement [`TaskSuite`] (tasks per split, a real [`Environment`],
//! the replay of a task's reference solution as its seed, an evaluation judge), register it by
//! name and the whole pipeline — collect, warm-up, self-rehearsal GRPO, evaluation — runs on
//! it. The suite here is a counter (`examples/support/counter_suite.rs`).
//!
//! `cargo run --release --example custom_suite` collects the seeds of three tasks and prints
//! them. With arguments it is the whole `envace` command line with the suite registered as
//! `counter`, so a run config can name it:
//!
//! ```text
//! printf 'environment = "counter"\n' > counter.toml
//! cargo run --release --example custom_suite -- demo --config counter.toml --out runs/counter
//! ```
//!
//! [`Environment`]: envace::actors::Environment

#[path = "support/counter_suite.rs"]
mod counter_suite;

use std::sync::Arc;

use counter_suite::{CounterSuite, COUNTER};
use envace::actors::Split;
use envace::registry::Registry;
use envace::suite::TaskSuite;

fn main() -> std::process::ExitCode {
    if std::env::args().len() > 1 {
        let mut registry = Registry::builtin();
        registry.register_suite(COUNTER, || {
            Ok(Arc::new(CounterSuite::new(48, 16)) as Arc<dyn TaskSuite>)
        });
        return envace::cli::run_with(registry);
    }
    let suite = CounterSuite::new(3, 1);
    let mut env = (suite.environment())();
    for task in suite.tasks(Split::Train) {
        match suite.collect_seed(task, env.as_mut()) {
            Ok(c) => {
                let call = &c.seed.tool_calls[0];
                println!(
                    "{}: {:?} -> {}({}) = {} ({} real call)",
                    task.id,
                    task.user_turns[0][0],
                    call.name,
                    call.arguments_json,
                    call.result_json,
                    c.env_calls
                );
            }
            Err(e) => {
                eprintln!("custom_suite: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
