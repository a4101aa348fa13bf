//! `numaplane-exporter`: parse the arguments, then run.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = numaplane_exporter::cli::Cli::parse();
    numaplane_exporter::cli::run(cli)
}
