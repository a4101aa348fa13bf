//! docs/configuration.md is generated from the command-line definitions of the three binaries
//! (clap's introspection of `Cli::command()`), so every subcommand, flag, environment variable
//! and default is documented exactly as the binaries accept it. This test fails when the file
//! and the definitions differ; regenerate with
//! `NUMAPLANE_UPDATE_DOCS=1 cargo test -p numaplane-e2e --test cli_reference`.

use std::{fmt::Write as _, path::PathBuf};

use clap::CommandFactory as _;

const UPDATE_ENV: &str = "NUMAPLANE_UPDATE_DOCS";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
}

/// One table cell: single line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn describe_arg(arg: &clap::Arg) -> String {
    let help = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(h) => format!(
                "`{}` ({})",
                v.get_name(),
                cell(&h.to_string()).trim_end_matches('.')
            ),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    let mut out = cell(&help);
    if !out.is_empty() && !out.ends_with(['.', ')', ']']) {
        out.push('.');
    }
    if !values.is_empty() {
        let _ = write!(out, " One of: {}.", values.join(", "));
    }
    if arg.is_global_set() {
        out.push_str(" Global: also accepted after a subcommand.");
    }
    out
}

fn flag_name(arg: &clap::Arg) -> String {
    if arg.is_positional() {
        return format!("`<{}>`", arg.get_id());
    }
    let mut names = Vec::new();
    if let Some(s) = arg.get_short() {
        names.push(format!("`-{s}`"));
    }
    if let Some(l) = arg.get_long() {
        names.push(format!("`--{l}`"));
    }
    names.join(", ")
}

fn render_command(out: &mut String, cmd: &clap::Command, path: &str, depth: usize) {
    let heading = "#".repeat((depth + 2).min(6));
    let _ = writeln!(out, "{heading} `{path}`\n");
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let about = cell(&about.to_string());
        let stop = if about.ends_with('.') { "" } else { "." };
        let _ = writeln!(out, "{about}{stop}\n");
    }
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    if !args.is_empty() {
        out.push_str("| Flag | Environment variable | Default | Description |\n|---|---|---|---|\n");
        for a in args {
            let env = a
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_else(|| "—".to_owned());
            let defaults: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .collect();
            let default = if defaults.is_empty() {
                "—".to_owned()
            } else {
                format!("`{}`", defaults.join(","))
            };
            let _ = writeln!(
                out,
                "| {} | {env} | {default} | {} |",
                flag_name(a),
                describe_arg(a)
            );
        }
        out.push('\n');
    }
    // Old spellings still read, kept out of --help: listed so that a manifest using one is
    // understood, and so that removing one is a visible change here.
    let deprecated: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_hide_set() && a.get_long().is_some())
        .collect();
    for a in deprecated {
        let env = a
            .get_env()
            .map(|e| format!(" (`{}`)", e.to_string_lossy()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "Hidden from `--help`: {}{env}. {}\n",
            flag_name(a),
            describe_arg(a)
        );
    }
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        render_command(out, sub, &format!("{path} {}", sub.get_name()), depth + 1);
    }
}

fn render() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the command-line definitions of the binaries by \
         `tests/tests/cli_reference.rs`; do not edit by hand. Regenerate with \
         `NUMAPLANE_UPDATE_DOCS=1 cargo test -p numaplane-e2e --test cli_reference`.\n\n\
         Every flag can also be set through its environment variable; a flag given on the command \
         line wins. A default written in brackets in the description (\"[default: …]\") is applied \
         after the configuration file, where the command has one (see docs/scheduler.md).\n\n\
         One thing has one name in every binary: the address of `/metrics`, `/healthz` and \
         `/readyz` is `--listen` (`NUMAPLANE_LISTEN`), the kubeconfig file `--kubeconfig` \
         (`NUMAPLANE_KUBECONFIG`, then `$KUBECONFIG`), the log filter `--log-level` \
         (`NUMAPLANE_LOG`), the output format `-o`/`--output` (`NUMAPLANE_OUTPUT`). An older \
         spelling that is still read is listed under its command, hidden from `--help`; see \
         docs/upgrading.md.\n\n",
    );
    let commands = [
        ("numaplane-exporter", numaplane_exporter::cli::Cli::command()),
        ("numaplane-scheduler", numaplane_scheduler::cli::Cli::command()),
        ("kubectl-numa", numaplane_scheduler::kubectl::Cli::command()),
    ];
    for (name, cmd) in &commands {
        render_command(&mut out, cmd, name, 0);
    }
    // One trailing newline, as editors and `git diff` expect.
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.push('\n');
    out
}

#[test]
fn configuration_reference_matches_the_cli_definitions() {
    let want = render();
    let path = doc_path();
    if std::env::var_os(UPDATE_ENV).is_some() {
        if let Err(e) = std::fs::write(&path, &want) {
            panic!("writing {}: {e}", path.display());
        }
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "{} is out of sync with the command-line definitions (first difference at line {}:\n  file:      {:?}\n  generated: {:?}).\nRegenerate it with:\n  {UPDATE_ENV}=1 cargo test -p numaplane-e2e --test cli_reference",
            path.display(),
            first + 1,
            have.lines().nth(first).unwrap_or("<end of file>"),
            want.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn every_flag_has_an_environment_variable() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let builtin = a.get_id() == "help" || a.get_id() == "version";
            if !a.is_positional() && !builtin && a.get_env().is_none() {
                missing.push(format!("{path} --{}", a.get_long().unwrap_or_default()));
            }
        }
        for s in cmd.get_subcommands() {
            walk(s, &format!("{path} {}", s.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(
        &numaplane_exporter::cli::Cli::command(),
        "numaplane-exporter",
        &mut missing,
    );
    walk(
        &numaplane_scheduler::cli::Cli::command(),
        "numaplane-scheduler",
        &mut missing,
    );
    walk(
        &numaplane_scheduler::kubectl::Cli::command(),
        "kubectl-numa",
        &mut missing,
    );
    assert!(missing.is_empty(), "flags without env: {missing:?}");
}
