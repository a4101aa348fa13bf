//! Command-line interface of `numaplane-exporter`.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

use crate::output::{self, Format};

pub use numaplane::EXIT_CONFIG;

/// numaplane per-node agent.
#[derive(Debug, Parser)]
#[command(name = "numaplane-exporter", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Logging options shared by every subcommand.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info,numaplane_exporter=debug`).
    #[arg(long, env = "NUMAPLANE_LOG", default_value = "info", global = true)]
    pub log_level: String,
    /// Log line format.
    #[arg(long, env = "NUMAPLANE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the machine model numaplane sees (NUMA nodes, CPUs, memory, hugepages, distances, PCI).
    Topology(TopologyArgs),
    /// Run the agent: read the kubelet, publish the NodeResourceTopology, serve metrics.
    /// With `--once --dry-run`, print the object it would publish and exit.
    Run(Box<crate::run::RunArgs>),
    /// Run the node-side allocator alone: one kubelet device plugin per pool, steering the
    /// kubelet to the devices the scheduler recorded (see docs/allocator.md).
    DevicePlugin(Box<crate::allocator::DevicePluginArgs>),
}

/// Arguments of `topology`.
#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// Read the machine from this hwloc XML file instead of the live system.
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_XML")]
    pub topology_xml: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, env = "NUMAPLANE_OUTPUT", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Sets up logging to stderr. Invalid filters are a configuration error.
fn init_logging(log: &LogArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.log_level)
        .map_err(|e| format!("invalid --log-level {:?}: {e}", log.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let result = match log.log_format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    // A second init (tests calling run twice) is harmless: keep the first subscriber.
    let _ = result;
    Ok(())
}

pub use crate::plumbing::load_machine;

/// Runs the parsed command line and maps failures to exit codes with one clear line.
pub fn run(cli: Cli) -> ExitCode {
    if let Err(msg) = init_logging(&cli.log) {
        eprintln!("numaplane-exporter: {msg}");
        return ExitCode::from(EXIT_CONFIG);
    }
    match cli.command {
        Command::Topology(args) => topology(&args),
        Command::Run(args) => run_agent(*args),
        Command::DevicePlugin(args) => run_device_plugin(*args),
    }
}

fn run_agent(args: crate::run::RunArgs) -> ExitCode {
    let machine = match load_machine(args.topology_xml.as_deref()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("numaplane-exporter: {}", numaplane::error_chain(&e));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // One thread: the agent is I/O-bound and small RSS matters on every node.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("numaplane-exporter: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pools = match &args.pools {
        Some(path) => match crate::allocator::pools::load(path, &machine) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("numaplane-exporter: bad --pools: {}", numaplane::error_chain(&e));
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => Vec::new(),
    };
    let view = crate::accounting::MachineView::from(&machine);
    match runtime.block_on(crate::run::run(args, view, pools)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("numaplane-exporter: {}", numaplane::error_chain(&e));
            if e.is_config() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run_device_plugin(args: crate::allocator::DevicePluginArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("numaplane-exporter: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::allocator::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("numaplane-exporter: {}", numaplane::error_chain(&e));
            if e.is_config() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn topology(args: &TopologyArgs) -> ExitCode {
    let machine = match load_machine(args.topology_xml.as_deref()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("numaplane-exporter: {}", numaplane::error_chain(&e));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rendered = match args.output {
        Format::Table => Ok(output::machine_table(&machine)),
        f => output::render_structured(&machine, f),
    };
    match rendered {
        Ok(s) => {
            print!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("numaplane-exporter: {}", numaplane::error_chain(&e));
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
