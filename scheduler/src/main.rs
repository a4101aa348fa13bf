//! `numaplane-scheduler`: parse the arguments, then run.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    numaplane_scheduler::cli::run(numaplane_scheduler::cli::Cli::parse())
}
