//! `numaplane-scheduler`: parse the arguments, then run.

use std::process::ExitCode;

fn main() -> ExitCode {
    match numaplane::parse_args::<numaplane_scheduler::cli::Cli>("numaplane-scheduler") {
        Ok(cli) => numaplane_scheduler::cli::run(cli),
        Err(code) => code,
    }
}
