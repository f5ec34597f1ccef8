//! The `envace` command line.
mod cli;

fn main() -> std::process::ExitCode {
    envace::runtime::tune_allocator(envace::runtime::AllocatorTuning::Speed);
    cli::run()
}
