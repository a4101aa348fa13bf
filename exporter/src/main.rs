//! `numaplane-exporter`: parse the arguments, then run.

use std::process::ExitCode;

fn main() -> ExitCode {
    match numaplane::parse_args::<numaplane_exporter::cli::Cli>("numaplane-exporter") {
        Ok(cli) => numaplane_exporter::cli::run(cli),
        Err(code) => code,
    }
}
