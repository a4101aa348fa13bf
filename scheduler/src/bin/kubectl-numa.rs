//! `kubectl-numa`, the `kubectl numa` plugin: parse the arguments, then run.

use std::process::ExitCode;

fn main() -> ExitCode {
    match numaplane::parse_args::<numaplane_scheduler::kubectl::Cli>("kubectl-numa") {
        Ok(cli) => numaplane_scheduler::kubectl::run(cli),
        Err(code) => code,
    }
}
