//! Prints the NodeResourceTopology CRD YAML (`deploy/crd.yaml`).

use std::process::ExitCode;

fn main() -> ExitCode {
    match numaplane::crd::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("numaplane-crdgen: {}", numaplane::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
