//! The `numaplane-exporter`, `numaplane-scheduler` and `kubectl-numa` binaries for end-to-end
//! tests.
//!
//! Cargo only builds binaries for the integration tests of their own package
//! (`CARGO_BIN_EXE_*`), and this crate is another package. So the first test that needs the
//! binary runs `cargo build -p numaplane-e2e -p numaplane-exporter --bin numaplane-exporter`
//! once per test process, into the target directory and profile this test binary lives in;
//! selecting numaplane-e2e too keeps the feature resolution of `cargo test -p numaplane-e2e`,
//! so the dependencies already built are reused and only the binary is linked. Set
//! `NUMAPLANE_EXPORTER_BIN` / `NUMAPLANE_SCHEDULER_BIN` to use prebuilt binaries instead
//! (cross builds, CI caches).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of the exporter binary, built on first use.
pub fn exporter() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    provide(&BIN, "numaplane-exporter", "NUMAPLANE_EXPORTER_BIN")
}

/// The path of the scheduler binary, built on first use.
pub fn scheduler() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    provide(&BIN, "numaplane-scheduler", "NUMAPLANE_SCHEDULER_BIN")
}

/// The path of the `kubectl-numa` plugin binary (package numaplane-scheduler), built on first
/// use; `NUMAPLANE_KUBECTL_NUMA_BIN` names a prebuilt one.
pub fn kubectl_numa() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    provide_bin(
        &BIN,
        "numaplane-scheduler",
        "kubectl-numa",
        "NUMAPLANE_KUBECTL_NUMA_BIN",
    )
}

fn provide(cell: &'static OnceLock<Result<PathBuf, String>>, package: &str, env: &str) -> &'static Path {
    provide_bin(cell, package, package, env)
}

fn provide_bin(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    package: &str,
    bin: &str,
    env: &str,
) -> &'static Path {
    match cell.get_or_init(|| build(package, bin, env)) {
        Ok(path) => path,
        // Tests cannot proceed without the binary; say why loudly.
        #[allow(clippy::panic)]
        Err(e) => panic!("cannot provide the {package} binary: {e}"),
    }
}

/// The cargo that runs this test, without the variables cargo sets for the test process
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, …). Build scripts track some of them
/// (`rerun-if-env-changed`, as ring's does), and cargo reads a tracked variable from its own
/// environment: inherited, they would differ from the `cargo test` that built this binary, and
/// every run would rebuild ring, kube and the binaries, then the test binary after it.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into()));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// Builds binary `bin` of `package` next to this test binary (see the module comment) and
/// returns its path.
fn build(package: &str, bin: &str, env: &str) -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os(env) {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <target>[/<triple>]/<profile dir>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary location {}", exe.display()))?;
    let profile_name = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("unexpected profile dir {}", profile_dir.display()))?;
    let profile = match profile_name {
        "debug" => "dev",
        other => other,
    };
    let above = profile_dir
        .parent()
        .ok_or_else(|| format!("no target dir above {}", profile_dir.display()))?;
    let mut cmd = cargo();
    cmd.args(["build", "--quiet", "-p", "numaplane-e2e", "-p", package])
        .args(["--bin", bin, "--profile", profile]);
    let target_dir = if above.join("CACHEDIR.TAG").exists() {
        above.to_owned()
    } else {
        // A --target build: <target>/<triple>/<profile dir>.
        let triple = above
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("unexpected target layout at {}", above.display()))?;
        cmd.args(["--target", triple]);
        above
            .parent()
            .ok_or_else(|| format!("no target dir above {}", above.display()))?
            .to_owned()
    };
    run_cargo(cmd, &target_dir, &format!("cargo build of {package}"))?;
    let path = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("cargo built, but {} does not exist", path.display()))
    }
}

/// Runs `cmd` (a cargo build, `what`) in the workspace into `target_dir`.
fn run_cargo(mut cmd: Command, target_dir: &Path, what: &str) -> Result<(), String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = cmd
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The release builds of `numaplane-scheduler` and `numaplane-exporter`, as a user deploys
/// them: `cargo build --release -p numaplane-scheduler -p numaplane-exporter` into the target
/// directory this test binary lives in (a no-op when they are up to date), once per test
/// process. Returns (scheduler, exporter). `NUMAPLANE_SCHEDULER_BIN` and
/// `NUMAPLANE_EXPORTER_BIN` name prebuilt ones instead (both must be set).
pub fn release() -> (&'static Path, &'static Path) {
    static BINS: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    match BINS.get_or_init(build_release) {
        Ok((scheduler, exporter)) => (scheduler, exporter),
        // Tests cannot proceed without the binaries; say why loudly.
        #[allow(clippy::panic)]
        Err(e) => panic!("cannot provide the release binaries: {e}"),
    }
}

fn build_release() -> Result<(PathBuf, PathBuf), String> {
    if let (Some(s), Some(e)) = (
        std::env::var_os("NUMAPLANE_SCHEDULER_BIN"),
        std::env::var_os("NUMAPLANE_EXPORTER_BIN"),
    ) {
        return Ok((PathBuf::from(s), PathBuf::from(e)));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <target>/<profile dir>/deps/<test binary>
    let target_dir = exe
        .ancestors()
        .find(|d| d.join("CACHEDIR.TAG").exists())
        .ok_or_else(|| format!("no target dir above {}", exe.display()))?
        .to_owned();
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "numaplane-scheduler",
        "-p",
        "numaplane-exporter",
    ]);
    run_cargo(cmd, &target_dir, "cargo build --release")?;
    let bin = |name: &str| {
        target_dir
            .join("release")
            .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
    };
    Ok((bin("numaplane-scheduler"), bin("numaplane-exporter")))
}

/// One option of a subcommand's `--help`.
#[derive(Debug, Default, Clone)]
pub struct Flag {
    /// The environment variable it reads (`[env: X=]`).
    pub env: Option<String>,
    /// Its default (`[default: Y]`).
    pub default: Option<String>,
}

/// The options of `binary subcommand`, by long name (`--node-name`), from its `--help` (global
/// ones included): what the manifests may set. Panics with the help text when it cannot parse.
pub fn help_flags(binary: &Path, subcommand: &str) -> std::collections::BTreeMap<String, Flag> {
    let out = std::process::Command::new(binary)
        .args([subcommand, "--help"])
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("{} {subcommand} --help: {e}", binary.display()));
    assert!(
        out.status.success(),
        "{} {subcommand} --help: {out:?}",
        binary.display()
    );
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut flags = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let t = line.trim();
        // `--long …` or `-s, --long …`; not the `- value: …` lines of "Possible values".
        let header = t.starts_with("--") || (t.starts_with('-') && t.get(2..3) == Some(","));
        if header {
            current = t
                .split([' ', ',', '=', '['])
                .find(|w| w.starts_with("--"))
                .map(str::to_owned);
            if let Some(name) = &current {
                flags.insert(name.clone(), Flag::default());
            }
        } else if let Some(flag) = current.as_ref().and_then(|name| flags.get_mut(name)) {
            // `[env: X=]` and `[default: Y]` on their own line (long help) or after the text.
            let flag: &mut Flag = flag;
            if let Some((_, env)) = t.split_once("[env: ") {
                flag.env = env.split(['=', ']']).next().map(str::to_owned);
            }
            if let Some((_, default)) = t.split_once("[default: ") {
                flag.default = default.split(']').next().map(str::to_owned);
            }
        }
    }
    assert!(
        flags.contains_key("--help"),
        "cannot parse {} {subcommand} --help:\n{help}",
        binary.display()
    );
    flags
}

/// Asserts that every environment variable of a container is read by one of `flags` (the
/// options of `command`) and is set by exactly one of `value` and `valueFrom`; `what` names
/// the container.
pub fn assert_env_is_read(
    what: &str,
    command: &str,
    env: &[k8s_openapi::api::core::v1::EnvVar],
    flags: &std::collections::BTreeMap<String, Flag>,
) {
    let read: Vec<&str> = flags.values().filter_map(|f| f.env.as_deref()).collect();
    for e in env {
        assert!(
            read.contains(&e.name.as_str()),
            "{what}: env {} is not read by `{command}` (it reads {read:?})",
            e.name
        );
        assert!(
            e.value.is_some() != e.value_from.is_some(),
            "{what}: env {}: value or valueFrom",
            e.name
        );
    }
}

/// Asserts that every `--flag` among a container's `args` is one of `flags` (the options of
/// `command`).
pub fn assert_args_are_flags(
    what: &str,
    command: &str,
    args: &[String],
    flags: &std::collections::BTreeMap<String, Flag>,
) {
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let name = a.split('=').next().unwrap_or_default();
        assert!(
            flags.contains_key(name),
            "{what}: {a} is not a flag of `{command}`"
        );
    }
}
