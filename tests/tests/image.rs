//! `scripts/image`: the OCI image archive the deploy manifests run, built without a registry or
//! a Docker daemon.
//!
//! The script packs the debug binaries `cargo test` already built (`--binaries`, so CI makes no
//! release build; see `numaplane_e2e::binaries`). Then:
//!
//! - the archive is checked with real OCI tools: `skopeo inspect` (architecture, OS,
//!   entrypoint, one layer), `skopeo copy` to an OCI layout (which verifies every blob digest)
//!   and `umoci unpack`; its index names the image for containerd and its `manifest.json` for
//!   `docker load`; two builds of the same binaries are byte-identical;
//! - the unpacked root filesystem holds the two binaries, every shared library `ldd` names for
//!   them (resolved inside the rootfs, symlinks and all) and nothing else but the CA bundle,
//!   `/etc/passwd`, `/etc/group`, `/etc/nsswitch.conf` and `/tmp`; the library check is shown
//!   to fail on a rootfs missing `libhwloc`;
//! - as root, both binaries run in the rootfs under `chroot` (the scheduler as UID 65532), and a
//!   containerd started by the test (Debian's `containerd` and `runc`; own root, state and
//!   socket, CRI plugin off) imports the archive with the README's command and with the one
//!   `kind load image-archive` runs, then runs the image: both `--version`s, the entrypoint,
//!   and `numaplane-exporter topology` inside the container equal to the host's (hwloc, its
//!   libraries and PCI discovery work in the image). Not root: the chroot and containerd steps
//!   are skipped, and the test says so on stderr.
//!
//! `scripts/setup` installs skopeo, umoci, jq, containerd and runc; without them the test fails
//! and says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use numaplane_e2e::render;
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const BINARIES: [&str; 2] = ["numaplane-exporter", "numaplane-scheduler"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A line on the test's real stderr, shown even when the test passes (the test harness captures
/// only `print!` and `eprint!`).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "image test: {line}");
}

/// Runs `cmd`, panics with its output unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Asserts that the command `what` succeeded; a failure shows its output and containerd's log.
#[track_caller]
fn assert_ran(what: &str, out: &Output, containerd_log: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}\ncontainerd log:\n{containerd_log}",
        out.status,
        stdout(out),
        String::from_utf8_lossy(&out.stderr),
    );
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `name` on `PATH` (or in /usr/sbin, /sbin); missing is a failure that says how to get it.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("the image test needs `{name}`, which is not installed: run scripts/setup"))
}

fn is_root() -> bool {
    let out = run(Command::new("id").arg("-u"));
    stdout(&out).trim() == "0"
}

fn json(bytes: &[u8], what: &str) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{what} is not JSON: {e}"))
}

/// The tag the script writes, without building.
fn script_tag() -> String {
    let out = run(Command::new(workspace().join("scripts/image")).arg("--print-tag"));
    stdout(&out).trim().to_owned()
}

/// Every `image` in `value`.
fn images(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("image", Value::String(s)) => found.push(s.clone()),
                    _ => images(v, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| images(v, found)),
        _ => {}
    }
}

#[test]
fn manifests_run_the_image_the_script_writes() {
    let tag = script_tag();
    assert_eq!(tag, format!("ghcr.io/numaplane/numaplane:{VERSION}"));
    let deploy = workspace().join("deploy");
    let components: Vec<PathBuf> = ["allocator", "extender", "servicemonitor"]
        .iter()
        .map(|c| deploy.join(c))
        .collect();
    let objects = render::kustomize(&deploy, &components).unwrap();
    let mut found = Vec::new();
    objects.iter().for_each(|o| images(o, &mut found));
    // The exporter DaemonSet, the scheduler Deployment and the extender DaemonSet.
    assert!(found.len() >= 3, "images in deploy/: {found:?}");
    for image in &found {
        assert_eq!(image, &tag, "deploy/ runs {image}, scripts/image writes {tag}");
    }
    let dockerfile = fs::read_to_string(workspace().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("-t {tag} ")),
        "the Dockerfile's build command should tag {tag}"
    );
}

// ---------------------------------------------------------------------------------------------
// The root filesystem
// ---------------------------------------------------------------------------------------------

/// Where absolute `path` leads inside `root`, following symlinks as the kernel would with
/// `root` as `/` (an absolute link target is relative to `root`, not to this machine).
fn resolve_in(root: &Path, path: &str) -> Result<PathBuf, String> {
    let mut pending: VecDeque<String> = path.split('/').map(str::to_owned).collect();
    let mut resolved = PathBuf::new();
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let candidate = resolved.join(&part);
        let on_disk = root.join(&candidate);
        let meta =
            fs::symlink_metadata(&on_disk).map_err(|_| format!("/{} does not exist", candidate.display()))?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return Err(format!("too many symlinks resolving {path}"));
            }
            let target = fs::read_link(&on_disk).map_err(|e| format!("{}: {e}", on_disk.display()))?;
            let target = target.to_string_lossy().into_owned();
            if target.starts_with('/') {
                resolved = PathBuf::new();
            }
            for (i, p) in target.split('/').enumerate() {
                pending.insert(i, p.to_owned());
            }
        } else {
            resolved = candidate;
        }
    }
    Ok(root.join(resolved))
}

/// The paths `ldd` names for `binary` (the loader included, the vDSO not), with the name each
/// is needed as; "not found" entries as `Err`.
fn ldd(binary: &Path) -> Vec<Result<(String, String), String>> {
    let out = Command::new("ldd").arg(binary).output().expect("ldd");
    let text = stdout(&out);
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some((name, rest)) = line.split_once(" => ") {
            if rest.starts_with("not found") {
                libs.push(Err(name.to_owned()));
            } else if let Some(path) = rest.split(" (").next().filter(|p| p.starts_with('/')) {
                libs.push(Ok((name.to_owned(), path.to_owned())));
            }
        } else if line.starts_with('/') {
            let path = line.split(" (").next().unwrap_or(line);
            libs.push(Ok((path.to_owned(), path.to_owned())));
        }
    }
    assert!(
        !libs.is_empty() || text.contains("statically linked"),
        "no libraries from ldd {}: {text}{}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    libs
}

/// What the binary at `bin` (absolute, inside `root`) needs that `root` lacks: every library
/// and the loader `ldd` names must resolve, inside `root`, to a regular file.
fn missing_libraries(root: &Path, bin: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for lib in ldd(&root.join(bin.trim_start_matches('/'))) {
        match lib {
            Err(name) => missing.push(format!("{bin}: {name} not found even on this machine")),
            Ok((name, path)) => match resolve_in(root, &path) {
                Ok(file) if file.is_file() => {}
                Ok(other) => missing.push(format!("{bin}: {name} ({path}) is {}", other.display())),
                Err(e) => missing.push(format!("{bin}: {name} ({path}): {e}")),
            },
        }
    }
    missing
}

/// Every regular file under `root`, as absolute paths inside it.
fn regular_files(root: &Path, dir: &Path, files: &mut BTreeSet<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            regular_files(root, &entry.path(), files);
        } else if kind.is_file() {
            files.insert(Path::new("/").join(entry.path().strip_prefix(root).unwrap()));
        }
    }
}

fn check_rootfs(rootfs: &Path, inputs: &Path) {
    // The binaries, unchanged.
    for bin in BINARIES {
        let packed = rootfs.join("usr/local/bin").join(bin);
        assert!(
            Command::new("cmp")
                .arg("-s")
                .arg(inputs.join(bin))
                .arg(&packed)
                .status()
                .unwrap()
                .success(),
            "/usr/local/bin/{bin} in the image differs from the binary packed"
        );
        assert_eq!(fs::metadata(&packed).unwrap().permissions().mode() & 0o777, 0o755);
    }

    // Every library, and the library check fails where one is missing.
    let mut expected: BTreeSet<PathBuf> = BINARIES
        .iter()
        .map(|b| Path::new("/usr/local/bin").join(b))
        .collect();
    for bin in BINARIES {
        let bin = format!("/usr/local/bin/{bin}");
        let missing = missing_libraries(rootfs, &bin);
        assert!(missing.is_empty(), "the image lacks libraries: {missing:#?}");
        for (_, path) in ldd(&rootfs.join(&bin[1..])).into_iter().flatten() {
            let file = resolve_in(rootfs, &path).unwrap();
            expected.insert(Path::new("/").join(file.strip_prefix(rootfs).unwrap()));
        }
    }
    let exporter = "/usr/local/bin/numaplane-exporter";
    let (_, hwloc) = ldd(&rootfs.join(&exporter[1..]))
        .into_iter()
        .flatten()
        .find(|(name, _)| name.starts_with("libhwloc.so"))
        .expect("the exporter links libhwloc");
    let hwloc_file = resolve_in(rootfs, &hwloc).unwrap();
    let aside = hwloc_file.with_extension("aside");
    fs::rename(&hwloc_file, &aside).unwrap();
    let missing = missing_libraries(rootfs, exporter);
    fs::rename(&aside, &hwloc_file).unwrap();
    assert!(
        missing.iter().any(|m| m.contains("libhwloc.so")),
        "the library check did not notice libhwloc missing: {missing:?}"
    );
    assert!(missing_libraries(rootfs, exporter).is_empty());

    // Users, CA bundle, /tmp; and nothing else (no shell, no package manager).
    let passwd = fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    let users: Vec<Vec<&str>> = passwd.lines().map(|l| l.split(':').collect()).collect();
    assert!(
        users
            .iter()
            .any(|u| u.len() == 7 && u[0] == "root" && u[2] == "0" && u[3] == "0")
    );
    assert!(
        users
            .iter()
            .any(|u| u.len() == 7 && u[2] == "65532" && u[3] == "65532"),
        "no user 65532 (the scheduler's) in /etc/passwd:\n{passwd}"
    );
    let group = fs::read_to_string(rootfs.join("etc/group")).unwrap();
    assert!(
        group.lines().any(|l| l.split(':').nth(2) == Some("65532")),
        "{group}"
    );
    let certs = fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(
        certs.matches("-----BEGIN CERTIFICATE-----").count() > 10,
        "no CA bundle"
    );
    let tmp = fs::symlink_metadata(rootfs.join("tmp")).unwrap();
    assert!(tmp.is_dir());
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777, "/tmp is not 1777");
    for file in [
        "/etc/passwd",
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        expected.insert(PathBuf::from(file));
    }
    let mut files = BTreeSet::new();
    regular_files(rootfs, rootfs, &mut files);
    assert_eq!(
        files, expected,
        "the image holds other files than the binaries need"
    );
    assert!(resolve_in(rootfs, "/bin/sh").is_err(), "the image has a shell");
}

/// Both binaries start in the rootfs alone, the scheduler as its deployment's user.
fn run_in_chroot(rootfs: &Path) {
    for (bin, user) in [
        ("numaplane-exporter", "0:0"),
        ("numaplane-scheduler", "65532:65532"),
    ] {
        let out = run(Command::new(tool("chroot"))
            .arg(format!("--userspec={user}"))
            .arg(rootfs)
            .arg(format!("/usr/local/bin/{bin}"))
            .arg("--version")
            .env_clear());
        assert_eq!(stdout(&out).trim(), format!("{bin} {VERSION}"));
    }
}

// ---------------------------------------------------------------------------------------------
// containerd
// ---------------------------------------------------------------------------------------------

/// A containerd of the test's own (root, state, socket under `dir`; no CRI), stopped on drop.
struct Containerd {
    child: Child,
    address: PathBuf,
    log: PathBuf,
    ctr: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> Containerd {
        let containerd = tool("containerd");
        let ctr = tool("ctr");
        tool("runc");
        fs::create_dir_all(dir).unwrap();
        let address = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{}\"\nstate = \"{}\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{}\"\n",
                dir.join("root").display(),
                dir.join("state").display(),
                address.display()
            ),
        )
        .unwrap();
        let log = dir.join("containerd.log");
        let child = Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting containerd");
        let mut daemon = Containerd {
            child,
            address,
            log,
            ctr,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("containerd exited ({status}):\n{}", daemon.log_text());
            }
            let version = daemon.ctr().arg("version").output().unwrap();
            if version.status.success() {
                break daemon;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not start:\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `ctr --address … --namespace k8s.io` (the namespace the kubelet's images live in).
    fn ctr(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.arg("--address").arg(&self.address).arg("--namespace=k8s.io");
        cmd
    }

    /// Runs `ctr …`; panics with ctr's and containerd's output unless it succeeds.
    fn ctr_ok(&self, args: &[&str]) -> Output {
        let out = self.ctr().args(args).output().unwrap();
        assert_ran(&format!("ctr {args:?}"), &out, &self.log_text());
        out
    }

    /// overlayfs where this filesystem allows it, else native.
    fn snapshotter(&self) -> &'static str {
        let plugins = stdout(&self.ctr_ok(&["plugins", "ls"]));
        let overlay = plugins.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4 && f[0] == "io.containerd.snapshotter.v1" && f[1] == "overlayfs" && f[3] == "ok"
        });
        if overlay { "overlayfs" } else { "native" }
    }

    fn image_names(&self) -> BTreeSet<String> {
        stdout(&self.ctr_ok(&["images", "ls", "-q"]))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn containerd_imports_and_runs(dir: &Path, archive: &Path, tag: &str) {
    let daemon = Containerd::start(dir);
    let snapshotter = daemon.snapshotter();
    let archive_arg = archive.to_str().unwrap();
    let snapshotter_arg = format!("--snapshotter={snapshotter}");

    // deploy/README.md's command.
    daemon.ctr_ok(&["images", "import", &snapshotter_arg, archive_arg]);
    assert!(
        daemon.image_names().contains(tag),
        "ctr import: {:?}",
        daemon.image_names()
    );
    for name in daemon.image_names() {
        daemon.ctr_ok(&["images", "rm", &name]);
    }
    // What `kind load image-archive` runs on each node, the archive on stdin.
    let out = daemon
        .ctr()
        .args([
            "images",
            "import",
            "--all-platforms",
            "--digests",
            &snapshotter_arg,
            "-",
        ])
        .stdin(fs::File::open(archive).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kind's import: {out:?}\n{}",
        daemon.log_text()
    );
    assert!(
        daemon.image_names().contains(tag),
        "kind's import: {:?}",
        daemon.image_names()
    );

    let container = |n: usize, args: &[&str], read_only: bool| {
        let id = format!("numaplane-image-test-{n}");
        let mut cmd = daemon.ctr();
        cmd.args(["run", "--rm", &snapshotter_arg]);
        if read_only {
            cmd.arg("--read-only");
        }
        cmd.args([tag, &id]).args(args);
        let out = cmd.output().unwrap();
        (out, id)
    };
    let ran = |n: usize, args: &[&str], read_only: bool| {
        let (out, id) = container(n, args, read_only);
        assert_ran(&format!("container {id} {args:?}"), &out, &daemon.log_text());
        stdout(&out)
    };
    for (n, bin) in BINARIES.iter().enumerate() {
        let got = ran(n, &[&format!("/usr/local/bin/{bin}"), "--version"], true);
        assert_eq!(got.trim(), format!("{bin} {VERSION}"));
    }
    // No arguments: the entrypoint, the exporter, asks for a subcommand.
    let (out, _) = container(2, &[], true);
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        !out.status.success() && text.contains("Usage: numaplane-exporter"),
        "{out:?}"
    );
    // hwloc in the container sees the machine the host binary sees, PCI devices included.
    let inside = ran(
        3,
        &["/usr/local/bin/numaplane-exporter", "topology", "-o", "json"],
        true,
    );
    let host = run(Command::new(numaplane_e2e::binaries::exporter()).args(["topology", "-o", "json"]));
    assert_eq!(
        json(inside.as_bytes(), "topology in the container"),
        json(&host.stdout, "topology on the host"),
        "the exporter in the container sees another machine"
    );
    say(&format!(
        "containerd ({snapshotter} snapshotter) imported the archive (README and kind commands) and ran the image"
    ));
}

// ---------------------------------------------------------------------------------------------
// The archive
// ---------------------------------------------------------------------------------------------

#[test]
fn image_archive_is_complete_and_loads_into_containerd() {
    let tag = script_tag();
    let skopeo = tool("skopeo");
    let umoci = tool("umoci");
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // The debug binaries, side by side as --binaries wants them.
    let inputs = dir.join("binaries");
    fs::create_dir(&inputs).unwrap();
    for (bin, path) in BINARIES.iter().zip([
        numaplane_e2e::binaries::exporter(),
        numaplane_e2e::binaries::scheduler(),
    ]) {
        std::os::unix::fs::symlink(path, inputs.join(bin)).unwrap();
    }
    let build = |output: &Path| {
        let started = Instant::now();
        run(Command::new(workspace().join("scripts/image"))
            .arg("--binaries")
            .arg(&inputs)
            .arg("--output")
            .arg(output));
        started.elapsed()
    };
    let archive = dir.join("numaplane.oci.tar");
    let took = build(&archive);
    let size = fs::metadata(&archive).unwrap().len();
    say(&format!(
        "scripts/image packed the debug binaries in {:.1} s: {:.1} MiB archive",
        took.as_secs_f64(),
        size as f64 / (1 << 20) as f64
    ));
    let again = dir.join("again.oci.tar");
    build(&again);
    assert!(
        fs::read(&archive).unwrap() == fs::read(&again).unwrap(),
        "two builds of the same binaries differ"
    );
    fs::remove_file(&again).unwrap();

    // The names loaders read.
    let layout = dir.join("layout");
    fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout));
    let read = |p: &str| fs::read(layout.join(p)).unwrap_or_else(|e| panic!("{p} in the archive: {e}"));
    assert_eq!(
        json(&read("oci-layout"), "oci-layout")["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&read("index.json"), "index.json");
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    let entry = &manifests[0];
    assert_eq!(entry["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(entry["annotations"]["io.containerd.image.name"], tag.as_str());
    assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], VERSION);
    let blob = |digest: &Value| format!("blobs/{}", digest.as_str().unwrap().replacen(':', "/", 1));
    let manifest = json(&read(&blob(&entry["digest"])), "the image manifest");
    let docker = json(&read("manifest.json"), "manifest.json");
    assert_eq!(docker[0]["RepoTags"], serde_json::json!([tag]));
    assert_eq!(docker[0]["Config"], blob(&manifest["config"]["digest"]).as_str());
    let layers: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| blob(&l["digest"]))
        .collect();
    assert_eq!(docker[0]["Layers"], serde_json::json!(layers));

    // skopeo: the image and its configuration.
    let inspect = json(
        &run(Command::new(&skopeo)
            .arg("inspect")
            .arg(format!("oci-archive:{}:{VERSION}", archive.display())))
        .stdout,
        "skopeo inspect",
    );
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    assert_eq!(inspect["Architecture"], arch);
    assert_eq!(inspect["Os"], "linux");
    assert_eq!(inspect["Layers"].as_array().map(Vec::len), Some(1), "{inspect}");
    assert_eq!(inspect["Labels"]["org.opencontainers.image.version"], VERSION);
    let config = json(
        &run(Command::new(&skopeo)
            .args(["inspect", "--config"])
            .arg(format!("oci-archive:{}", archive.display())))
        .stdout,
        "skopeo inspect --config",
    );
    // The exporter DaemonSet gives only `args`; the Deployments give `command`.
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/numaplane-exporter"])
    );
    assert!(config["config"]["Cmd"].is_null(), "{config}");
    assert!(
        config["config"]["User"].as_str().unwrap_or("").is_empty(),
        "{config}"
    );

    // skopeo copy verifies every blob's digest; umoci unpacks the layer.
    let oci = dir.join("oci");
    run(Command::new(&skopeo)
        .arg("copy")
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("oci:{}:{VERSION}", oci.display())));
    let bundle = dir.join("bundle");
    let root = is_root();
    let mut unpack = Command::new(&umoci);
    unpack.arg("unpack");
    if !root {
        unpack.arg("--rootless");
    }
    run(unpack
        .arg("--image")
        .arg(format!("{}:{VERSION}", oci.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    check_rootfs(&rootfs, &inputs);

    if root {
        run_in_chroot(&rootfs);
        containerd_imports_and_runs(&dir.join("containerd"), &archive, &tag);
    } else {
        say(
            "SKIPPED running the binaries in the image's rootfs (chroot) and importing the archive \
             into containerd and running it: both need root. The archive, its names, its layer \
             and every library were checked.",
        );
    }
}
