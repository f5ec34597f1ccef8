//! The `envace` command line.

fn main() -> std::process::ExitCode {
    envace::runtime::tune_allocator(envace::runtime::AllocatorTuning::Speed);
    envace::cli::run()
}
