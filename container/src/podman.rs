//! The container runtime: podman, driven through its command line (as an operator would),
//! with gstore's CRIU first on its `PATH` so that podman's runtime (runc) dumps and restores
//! with a CRIU that works on this kernel.

use crate::error::{ContainerError, Result};
use gstore_gpu_dump::Criu;
use serde::Deserialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// podman on this machine.
pub struct Podman {
    bin: PathBuf,
    /// `PATH` for podman: CRIU's directory first.
    path_env: OsString,
    /// The CRIU podman's runtime will find.
    criu: Criu,
}

/// A container as podman describes it.
#[derive(Clone, Debug)]
pub struct Container {
    /// Its full id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The image it was created from, by name.
    pub image: String,
    /// That image's id.
    pub image_id: String,
    /// Whether it runs now.
    pub running: bool,
    /// Its state in podman's words ("running", "exited", ...).
    pub status: String,
}

#[derive(Deserialize)]
struct Inspected {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "ImageName", default)]
    image_name: String,
    #[serde(rename = "Image", default)]
    image: String,
    #[serde(rename = "State")]
    state: InspectedState,
}

#[derive(Deserialize)]
struct InspectedState {
    #[serde(rename = "Running")]
    running: bool,
    #[serde(rename = "Status", default)]
    status: String,
}

/// The last lines of a command's standard error, for an error message.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// The failure of `command`, which ended as `out` says.
pub(crate) fn failed(command: String, out: &std::process::Output) -> ContainerError {
    ContainerError::Runtime { command, status: out.status.to_string(), stderr: tail(&out.stderr) }
}

/// The first `name` in a `PATH` directory.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Whether `name ARGS` (found on `PATH`) runs and succeeds, its output discarded.
pub(crate) fn succeeds(name: &str, args: &[&str]) -> bool {
    on_path(name).is_some_and(|bin| {
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// This process's `PATH` with `criu`'s directory first: a runtime running `criu` from its
/// `PATH` runs gstore's.
pub(crate) fn path_with_criu_first(criu: &Criu) -> OsString {
    let path_env = std::env::var_os("PATH").unwrap_or_default();
    let criu_dir = criu.path().parent().map(Path::to_path_buf).unwrap_or_default();
    std::env::join_paths(std::iter::once(criu_dir).chain(std::env::split_paths(&path_env))).unwrap_or(path_env)
}

impl Podman {
    /// Whether `podman` is on `PATH`.
    pub fn installed() -> bool {
        on_path("podman").is_some()
    }

    /// Whether podman knows a container `name` (`podman container exists`), without CRIU.
    pub fn knows(name: &str) -> bool {
        succeeds("podman", &["container", "exists", name])
    }

    /// podman from `PATH`, with the CRIU gstore uses (`criu`, else the one it finds) first on
    /// podman's `PATH`.
    pub fn find(criu: Option<&Path>) -> Result<Podman> {
        let bin = on_path("podman").ok_or_else(|| {
            ContainerError::NoRuntime(
                "podman is not installed (Debian: apt-get install podman runc); gstore checkpoints and restores \
                 containers through it, or through runc where there is no podman (`--runtime runc`)"
                    .into(),
            )
        })?;
        let criu = Criu::find(criu).map_err(|e| ContainerError::NoRuntime(format!("podman needs CRIU >= 4: {e}")))?;
        Ok(Podman { bin, path_env: path_with_criu_first(&criu), criu })
    }

    /// The CRIU podman's runtime uses.
    pub fn criu(&self) -> &Criu {
        &self.criu
    }

    /// A podman command with gstore's CRIU first on its `PATH`.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args).env("PATH", &self.path_env).stdin(Stdio::null());
        c
    }

    /// `podman ARGS` as text for messages.
    fn describe(args: &[&str]) -> String {
        format!("podman {}", args.join(" "))
    }

    /// Runs `podman ARGS` to its end, capturing its output.
    fn output(&self, args: &[&str]) -> Result<std::process::Output> {
        self.command(args).output().map_err(|e| ContainerError::io("running", &self.bin, e))
    }

    /// Runs `podman ARGS`; its standard output, or the failure with the end of its stderr.
    fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        if !out.status.success() {
            return Err(failed(Self::describe(args), &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// podman's version (`podman --version`'s last word).
    pub fn version(&self) -> String {
        self.run(&["--version"]).ok().and_then(|v| v.split_whitespace().last().map(str::to_string)).unwrap_or_default()
    }

    /// The container named (or with the id) `name`.
    pub fn inspect(&self, name: &str) -> Result<Container> {
        let args = ["container", "inspect", "--format", "json", name];
        let out = self.output(&args)?;
        if !out.status.success() {
            if String::from_utf8_lossy(&out.stderr).contains("no such container") {
                return Err(ContainerError::NoSuchContainer(name.to_string()));
            }
            return Err(failed(Self::describe(&args), &out));
        }
        let mut all: Vec<Inspected> = serde_json::from_slice(&out.stdout).map_err(|e| ContainerError::Runtime {
            command: Self::describe(&args),
            status: "unreadable output".into(),
            stderr: e.to_string(),
        })?;
        let c = all.pop().ok_or_else(|| ContainerError::NoSuchContainer(name.to_string()))?;
        Ok(Container {
            id: c.id,
            name: c.name,
            image: c.image_name,
            image_id: c.image,
            running: c.state.running,
            status: c.state.status,
        })
    }

    /// Whether a container named `name` exists.
    pub fn container_exists(&self, name: &str) -> Result<bool> {
        self.exists(&["container", "exists", name])
    }

    /// Whether the image `id` (or name) is in podman's storage.
    pub fn image_exists(&self, id: &str) -> Result<bool> {
        self.exists(&["image", "exists", id])
    }

    /// `podman ... exists`: exit 0 yes, 1 no, anything else a failure.
    fn exists(&self, args: &[&str]) -> Result<bool> {
        let out = self.output(args)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(failed(Self::describe(args), &out)),
        }
    }

    /// Starts `podman container checkpoint` of `name` exporting an uncompressed archive to
    /// `to` (a FIFO gstore reads). Without `leave_running` podman keeps its own copy of the
    /// CRIU images, so that the container can be restored in place if storing fails.
    pub fn start_checkpoint(&self, name: &str, to: &Path, leave_running: bool) -> Result<(Child, String)> {
        let export = format!("--export={}", to.display());
        let mut args = vec!["container", "checkpoint", export.as_str(), "--compress=none"];
        args.push(if leave_running { "--leave-running" } else { "--keep" });
        args.push(name);
        let child = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ContainerError::io("running", &self.bin, e))?;
        Ok((child, Self::describe(&args)))
    }

    /// Waits for a command started here; its failure with the end of its stderr.
    pub fn wait(child: Child, command: String) -> Result<()> {
        let out = child.wait_with_output().map_err(|e| ContainerError::io("waiting for", "podman", e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(failed(command, &out))
        }
    }

    /// Restores the container `name` from the checkpoint podman kept of it (after a
    /// `--keep` checkpoint whose archive could not be stored).
    pub fn restore_kept(&self, name: &str) -> Result<()> {
        self.run(&["container", "restore", name]).map(drop)
    }

    /// `podman container restore --import=ARCHIVE [--name NAME]`: the new container's id.
    /// podman opens the archive twice (its configuration first, then everything), so it must
    /// be a file, not a pipe.
    pub fn restore_import(&self, archive: &Path, name: Option<&str>) -> Result<String> {
        let import = format!("--import={}", archive.display());
        let named = name.map(|n| format!("--name={n}"));
        let mut args = vec!["container", "restore", import.as_str()];
        args.extend(named.as_deref());
        Ok(self.run(&args)?.trim().to_string())
    }
}
