//! The `envace` command line.
mod cli;

fn main() -> std::process::ExitCode {
    envace::runtime::tune_allocator();
    cli::run()
}
