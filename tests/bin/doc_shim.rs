//! Stand-in for `cargo`, `kubectl`, `numaplane-scheduler` and `numaplane-exporter` while
//! tests/tests/doc_commands.rs runs every shell command of the README and docs as written. It is
//! called under those names (links on the test's PATH) and:
//! - `cargo run|build|test|bench`: picks the target as cargo does (`--bin`, else `default-run`,
//!   else the package's only binary; cargo's own error otherwise), then runs the binary the test
//!   suite already built (`run`), copies it where `cargo build` would put it (`build`), or only
//!   checks that the package and target exist (`test`, `bench`: running the suite from inside
//!   the suite would recurse). A nested cargo would rebuild with another feature set;
//! - `kubectl`: the real kubectl against the test's fake API server, except what needs a real
//!   cluster to mean anything (`apply -k` renders with `kubectl kustomize`, `apply -f` and
//!   `rollout`/`describe` check their flags with `--help`), and `kubectl numa` runs the plugin;
//! - the numaplane binaries: run as written; a server (`run` without `--once`, `extender`,
//!   `device-plugin`) must still be serving after a few seconds, then it is stopped.
//!
//! Its configuration comes from the environment the test sets (`NUMAPLANE_DOC_*`).
#![allow(clippy::print_stderr)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use serde::Deserialize;

/// What `cargo metadata` says of one package.
#[derive(Debug, Deserialize)]
struct Package {
    bins: Vec<String>,
    default_run: Option<String>,
    tests: Vec<String>,
    benches: Vec<String>,
}

/// How long a server must keep serving to count as started.
const SERVE_FOR: Duration = Duration::from_secs(3);

fn env_path(name: &str) -> Result<PathBuf, String> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{name} is not set (run through tests/tests/doc_commands.rs)"))
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let me = args
        .next()
        .and_then(|a| {
            Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let result = match me.as_str() {
        "cargo" => cargo(&args),
        "kubectl" => kubectl(&args),
        "numaplane-scheduler" | "numaplane-exporter" | "kubectl-numa" => binary(&me, &args),
        other => Err(format!("doc shim called as {other}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("doc shim: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `cmd` and returns its exit code (1 when killed by a signal).
fn status(cmd: &mut Command) -> Result<ExitCode, String> {
    let s = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    Ok(ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1)))
}

fn real_binary(name: &str) -> Result<PathBuf, String> {
    Ok(env_path("NUMAPLANE_DOC_BIN_DIR")?.join(name))
}

fn is_server(name: &str, args: &[String]) -> bool {
    let sub = args.iter().find(|a| !a.starts_with('-')).map(String::as_str);
    match (name, sub) {
        ("numaplane-scheduler", Some("run" | "extender")) => true,
        ("numaplane-exporter", Some("device-plugin")) => true,
        ("numaplane-exporter", Some("run")) => !args.iter().any(|a| a == "--once"),
        _ => false,
    }
}

fn binary(name: &str, args: &[String]) -> Result<ExitCode, String> {
    let path = real_binary(name)?;
    let mut cmd = Command::new(&path);
    cmd.args(args);
    if !is_server(name, args) {
        return status(&mut cmd);
    }
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", path.display()))?;
    let start = Instant::now();
    while start.elapsed() < SERVE_FOR {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            eprintln!("doc shim: `{name} {}` stopped: {s}", args.join(" "));
            return Ok(ExitCode::from(
                u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "doc shim: `{name} {}` still serving after {SERVE_FOR:?}; stopped",
        args.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

fn kubectl(args: &[String]) -> Result<ExitCode, String> {
    let real = env_path("NUMAPLANE_DOC_REAL_KUBECTL")?;
    // The verb, after global flags such as `-n NS`.
    let mut verbs = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if matches!(a.as_str(), "-n" | "--namespace" | "--context" | "--kubeconfig") {
            i += 2;
            continue;
        }
        if !a.starts_with('-') {
            verbs.push(a.as_str());
        }
        i += 1;
    }
    match verbs.as_slice() {
        ["numa", ..] => {
            let pos = args.iter().position(|a| a == "numa").unwrap_or(0);
            binary("kubectl-numa", &args[pos + 1..])
        }
        ["apply", ..] if args.iter().any(|a| a == "-k") => {
            let dir = args
                .iter()
                .skip_while(|a| *a != "-k")
                .nth(1)
                .ok_or("apply -k needs a directory")?;
            status(
                Command::new(&real)
                    .args(["kustomize", dir])
                    .stdout(std::process::Stdio::null()),
            )
        }
        ["apply", ..] | ["rollout", ..] | ["describe", ..] => status(
            Command::new(&real)
                .args(args)
                .arg("--help")
                .stdout(std::process::Stdio::null()),
        ),
        _ => status(Command::new(&real).args(args)),
    }
}

/// The parsed cargo command line.
#[derive(Default)]
struct CargoArgs {
    sub: String,
    packages: Vec<String>,
    bin: Option<String>,
    test: Option<String>,
    bench: Option<String>,
    release: bool,
    rest: Vec<String>,
}

fn parse_cargo(args: &[String]) -> Result<CargoArgs, String> {
    let mut c = CargoArgs::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        match flag {
            "--" => {
                c.rest = it.cloned().collect();
                break;
            }
            "-p" | "--package" => c.packages.push(value(flag)?),
            "--bin" => c.bin = Some(value(flag)?),
            "--test" => c.test = Some(value(flag)?),
            "--bench" => c.bench = Some(value(flag)?),
            "--release" | "-r" => c.release = true,
            "-q" | "--quiet" | "--locked" | "--offline" | "--frozen" | "--all-targets" => {}
            f if f.starts_with('-') => return Err(format!("cargo flag {f} is not known to the doc shim")),
            _ if c.sub.is_empty() => c.sub = a.clone(),
            // `cargo bench … -- 5000 100`-style positional filters without `--`.
            _ => c.rest.push(a.clone()),
        }
    }
    Ok(c)
}

fn cargo(args: &[String]) -> Result<ExitCode, String> {
    let c = parse_cargo(args)?;
    let table: BTreeMap<String, Package> = serde_json::from_str(
        &std::fs::read_to_string(env_path("NUMAPLANE_DOC_CARGO_TABLE")?).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let lookup = |name: &String| {
        table
            .get(name)
            .ok_or_else(|| format!("error: package ID specification `{name}` did not match any packages"))
    };
    if c.sub == "build" {
        let mut bins = Vec::new();
        for name in &c.packages {
            let pkg = lookup(name)?;
            match &c.bin {
                Some(b) if pkg.bins.contains(b) => bins.push(b.clone()),
                Some(_) => {}
                None => bins.extend(pkg.bins.iter().cloned()),
            }
        }
        if let Some(b) = &c.bin
            && !bins.contains(b)
        {
            return Err(format!("error: no bin target named `{b}`"));
        }
        let dir = Path::new("target").join(if c.release { "release" } else { "debug" });
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for b in bins {
            std::fs::copy(real_binary(&b)?, dir.join(&b)).map_err(|e| format!("{b}: {e}"))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let [name] = c.packages.as_slice() else {
        return Err("the docs name one package with -p".into());
    };
    let pkg = lookup(name)?;
    let bin = || -> Result<String, String> {
        if let Some(b) = &c.bin {
            return if pkg.bins.contains(b) {
                Ok(b.clone())
            } else {
                Err(format!("error: no bin target named `{b}` in `{name}` package"))
            };
        }
        match (&pkg.default_run, pkg.bins.as_slice()) {
            (Some(d), _) => Ok(d.clone()),
            (None, [only]) => Ok(only.clone()),
            (None, bins) => Err(format!(
                "error: `cargo run` could not determine which binary to run. Use the `--bin` option to specify a binary, or the `default-run` manifest key.\navailable binaries: {}",
                bins.join(", ")
            )),
        }
    };
    match c.sub.as_str() {
        "run" => {
            let b = bin()?;
            if matches!(
                b.as_str(),
                "numaplane-scheduler" | "numaplane-exporter" | "kubectl-numa"
            ) {
                binary(&b, &c.rest)
            } else {
                status(Command::new(real_binary(&b)?).args(&c.rest))
            }
        }
        "test" | "bench" => {
            let (kind, wanted, have) = if c.sub == "test" {
                ("test", &c.test, &pkg.tests)
            } else {
                ("bench", &c.bench, &pkg.benches)
            };
            if let Some(t) = wanted
                && !have.contains(t)
            {
                return Err(format!("error: no {kind} target named `{t}` in `{name}` package"));
            }
            eprintln!(
                "doc shim: `cargo {}` checked (package and target exist), not run from inside the suite",
                args.join(" ")
            );
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("`cargo {other}` is not known to the doc shim")),
    }
}
