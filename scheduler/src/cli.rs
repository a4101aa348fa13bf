//! Command-line interface of `numaplane-scheduler`.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::simulate::{self, ConfigFile};

pub use numaplane::EXIT_CONFIG;

/// numaplane NUMA-aware secondary scheduler.
#[derive(Debug, Parser)]
#[command(name = "numaplane-scheduler", version, about)]
pub struct Cli {
    /// Log filter in `tracing` EnvFilter syntax.
    #[arg(long, env = "NUMAPLANE_LOG", default_value = "warn", global = true)]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Schedule pods offline against a cluster described in files; no API server needed.
    Simulate(SimulateArgs),
    /// Serve as a secondary scheduler: watch, queue, decide, bind with the allocation record.
    Run(Box<crate::live::daemon_config::ServeArgs>),
    /// Serve kube-scheduler's extender verbs (filter, prioritize, bind) for clusters that keep
    /// kube-scheduler; see docs/extender.md.
    Extender(Box<crate::live::daemon_config::ServeArgs>),
}

/// Output format of `simulate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// The JSON report (schema in docs/simulate-output.md).
    Json,
    /// A table for people.
    Table,
}

/// Arguments of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Files with Nodes, NodeResourceTopologies and already-bound Pods (YAML multi-doc or JSON).
    #[arg(long = "cluster", env = "NUMAPLANE_SIM_CLUSTER", value_delimiter = ',', required = true, num_args = 1..)]
    pub cluster: Vec<PathBuf>,
    /// Files with the Pods to schedule, in order.
    #[arg(long = "pods", env = "NUMAPLANE_SIM_PODS", value_delimiter = ',', required = true, num_args = 1..)]
    pub pods: Vec<PathBuf>,
    /// Scheduler config: scoring strategy, resource weights, no-NRT behaviour.
    #[arg(long, env = "NUMAPLANE_SIM_CONFIG")]
    pub config: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, env = "NUMAPLANE_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Per-node verdicts in the report: for pods that fit nowhere (failed), for every pod
    /// (all: slower, every node evaluated afresh per pod), or none.
    #[arg(long, env = "NUMAPLANE_SIM_EXPLAIN", value_enum, default_value_t = simulate::Explain::Failed)]
    pub explain: simulate::Explain,
    /// NUMA alignment of DRA devices with the CPUs the kubelet pins (Required, Preferred or
    /// Ignore); overrides the config file's `draNuma.alignment` [default: Required].
    #[arg(long, env = "NUMAPLANE_SIM_DRA_NUMA_ALIGNMENT", value_parser = crate::live::daemon_config::dra_numa_alignment())]
    pub dra_numa_alignment: Option<crate::model_config::DraNumaAlignment>,
    /// Nodes whose kubelet options the model cannot predict: Warn or Avoid; overrides the
    /// config file's `unknownKubeletOptions` [default: Warn].
    #[arg(long, env = "NUMAPLANE_SIM_UNKNOWN_KUBELET_OPTIONS", value_parser = crate::live::daemon_config::unknown_kubelet_options())]
    pub unknown_kubelet_options: Option<crate::model_config::UnknownKubeletOptions>,
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "numaplane-scheduler: invalid --log-level {:?}: {e}",
                cli.log_level
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match cli.command {
        Command::Simulate(args) => run_simulate(&args),
        Command::Run(args) => run_live(&args, false),
        Command::Extender(args) => run_live(&args, true),
    }
}

fn run_live(args: &crate::live::daemon_config::ServeArgs, extender: bool) -> ExitCode {
    let cfg = match args.resolve() {
        Ok(c) => crate::live::daemon_config::ServeConfig { extender, ..c },
        Err(e) => {
            eprintln!("numaplane-scheduler: {}", numaplane::error_chain(&e));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("numaplane-scheduler: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::live::run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ crate::live::LiveError::Client(_)) => {
            eprintln!("numaplane-scheduler: {}", numaplane::error_chain(&e));
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("numaplane-scheduler: {}", numaplane::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn run_simulate(args: &SimulateArgs) -> ExitCode {
    let fail = |e: &(dyn std::error::Error + 'static)| {
        eprintln!("numaplane-scheduler: {}", numaplane::error_chain(e));
        ExitCode::from(EXIT_CONFIG)
    };
    let config = match &args.config {
        Some(p) => match simulate::read_config(p) {
            Ok(c) => c,
            Err(e) => return fail(&e),
        },
        None => ConfigFile::default(),
    };
    let mut config = config;
    if let Some(a) = args.dra_numa_alignment {
        config.dra_numa.alignment = Some(a);
    }
    if let Some(u) = args.unknown_kubelet_options {
        config.unknown_kubelet_options = u;
    }
    let cluster = match simulate::read_inputs(&args.cluster) {
        Ok(i) => i,
        Err(e) => return fail(&e),
    };
    let pods = match simulate::read_inputs(&args.pods) {
        Ok(i) => i.pods,
        Err(e) => return fail(&e),
    };
    let (report, model) = simulate::simulate_keeping_model(cluster, pods, &config, args.explain);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match args.output {
        Output::Table => out.write_all(simulate::render_table(&report).as_bytes()),
        Output::Json => serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n")),
    };
    // The process exits next: the operating system takes the model and the report back at
    // once, where freeing them allocation by allocation took a seventh of a dump's run.
    std::mem::forget(model);
    std::mem::forget(report);
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is the reader's choice, not a failure worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("numaplane-scheduler: writing the report: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

#[cfg(test)]
mod leader_elect_flag {
    use clap::Parser as _;

    use super::{Cli, Command};

    fn leader_elect(args: &[&str]) -> Result<Option<bool>, clap::Error> {
        let cli = Cli::try_parse_from(["numaplane-scheduler", "run"].iter().chain(args))?;
        match cli.command {
            Command::Run(a) => Ok(a.leader_elect),
            other => panic!("parsed as {other:?}"),
        }
    }

    /// kube-scheduler's flag is a pflag bool: bare means true, `=false` turns it off.
    #[test]
    fn bare_flag_means_true_like_kube_scheduler() {
        assert_eq!(leader_elect(&["--leader-elect"]).unwrap(), Some(true));
        assert_eq!(leader_elect(&["--leader-elect=false"]).unwrap(), Some(false));
        assert_eq!(leader_elect(&["--leader-elect=true"]).unwrap(), Some(true));
        assert_eq!(leader_elect(&[]).unwrap(), None);
        // The bare flag does not swallow the next argument.
        assert_eq!(
            leader_elect(&["--leader-elect", "--kube-api-qps", "5"]).unwrap(),
            Some(true)
        );
        assert!(leader_elect(&["--leader-elect=maybe"]).is_err());
    }
}

#[cfg(test)]
mod dra_numa_settings {
    use clap::Parser as _;

    use super::{Cli, Command};
    use crate::model_config::DraNumaAlignment;

    fn serve(args: &[&str], file: Option<&str>) -> Result<crate::model_config::DraNuma, String> {
        let dir = std::env::temp_dir().join(format!("numaplane-dra-numa-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // Tests run in parallel: one file per call.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("config-{call}.yaml"));
        let mut argv = vec!["numaplane-scheduler".to_owned(), "run".to_owned()];
        if let Some(text) = file {
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            argv.push(format!("--config={}", path.display()));
        }
        argv.extend(args.iter().map(|s| (*s).to_owned()));
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Run(a) = cli.command else {
            return Err("not run".to_owned());
        };
        let out = a.resolve().map(|c| c.dra_numa).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&path);
        out
    }

    #[test]
    fn defaults_file_and_flag_in_that_order() {
        let d = serve(&[], None).unwrap();
        assert_eq!(d.alignment, DraNumaAlignment::Required);
        assert_eq!(
            d.driver_attributes["dra.net"],
            vec!["dra.net/numaNode".to_owned()]
        );
        assert_eq!(d.driver_attributes["gpu.nvidia.com"], vec!["numa".to_owned()]);

        let file = "draNuma:\n  alignment: Preferred\n  driverAttributes:\n    gpu.example.com: [numa]\n    dra.net: []\n";
        let d = serve(&[], Some(file)).unwrap();
        assert_eq!(d.alignment, DraNumaAlignment::Preferred);
        assert_eq!(d.driver_attributes["gpu.example.com"], vec!["numa".to_owned()]);
        assert!(d.driver_attributes["dra.net"].is_empty());
        // Drivers the file does not name keep their built-in entry.
        assert_eq!(
            d.driver_attributes["sriovnetwork.k8snetworkplumbingwg.io"],
            vec!["dra.net/numaNode".to_owned()]
        );
        let d = serve(&["--dra-numa-alignment", "Ignore"], Some(file)).unwrap();
        assert_eq!(d.alignment, DraNumaAlignment::Ignore);
    }

    #[test]
    fn bad_values_are_refused() {
        let e = serve(&["--dra-numa-alignment", "Sometimes"], None).unwrap_err();
        assert!(e.contains("Sometimes"), "{e}");
        let e = serve(&[], Some("draNuma:\n  alignment: Always\n")).unwrap_err();
        assert!(e.contains("Always") || e.contains("alignment"), "{e}");
        let e = serve(&[], Some("draNuma:\n  mode: Required\n")).unwrap_err();
        assert!(e.contains("mode"), "{e}");
    }
}
