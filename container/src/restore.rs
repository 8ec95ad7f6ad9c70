//! A container restored from its checkpoint image into the runtime, after checking that this
//! machine can: runtime and CRIU present, the base image in the runtime's storage, the name
//! free. One clear error before anything runs.

use crate::archive::{self, ContainerMeta};
use crate::error::{ContainerError, Result};
use crate::podman::Podman;
use gstore_store::format::manifest::Manifest;
use gstore_store::format::meta::Kind;
use gstore_store::progress::Progress;
use gstore_store::IndexedStore;
use serde::Serialize;
use std::time::Instant;

/// What a container restore reports.
#[derive(Serialize)]
pub struct ContainerRestoreReport {
    /// The image restored.
    pub image: String,
    /// The restored container's name.
    pub container: String,
    /// Its id.
    pub id: String,
    /// Bytes of archive handed to the runtime.
    pub archive_bytes: u64,
    /// Seconds writing the archive from the store.
    pub archive_s: f64,
    /// Seconds of `podman container restore`.
    pub runtime_s: f64,
    /// Seconds in all.
    pub total_s: f64,
}

/// Checks that image `m` (named `image`) is a container checkpoint this machine can restore
/// as `name` (else the name it was checkpointed under); returns its container.
pub fn check(podman: &Podman, image: &str, m: &Manifest, name: Option<&str>) -> Result<ContainerMeta> {
    if m.kind() != Some(&Kind::ContainerCheckpoint) {
        let kind = m.kind().map_or("files", |k| k.as_str());
        return Err(ContainerError::NotACheckpoint(format!(
            "{image} is not a container checkpoint (its kind is {kind}); `gstore restore {image} --to DIR` writes its files"
        )));
    }
    let c = m.meta.container.clone().unwrap_or_default();
    let incompatible = |why: String| ContainerError::Incompatible { image: image.to_string(), why };
    let wanted = if c.image_id.is_empty() { &c.image } else { &c.image_id };
    if wanted.is_empty() {
        return Err(incompatible("its metadata names no base image (no config.dump in the archive?)".into()));
    }
    if !podman.image_exists(wanted)? {
        return Err(incompatible(format!(
            "its base image {} ({}) is not in podman's storage: `podman pull {}` (or `podman load`) first",
            if c.image.is_empty() { "?" } else { &c.image },
            c.image_id,
            if c.image.is_empty() { "IMAGE" } else { &c.image },
        )));
    }
    let name = name.unwrap_or(&c.name);
    if !name.is_empty() && podman.container_exists(name)? {
        return Err(ContainerError::NameTaken {
            image: image.to_string(),
            taken: format!(
                "a container named {name} exists: restore under another name with --name, or `podman rm {name}`"
            ),
        });
    }
    Ok(c)
}

/// Restores the container checkpoint `m` (image `image`) into podman as `name` (else under
/// its checkpointed name), after [`check`]. podman reads the archive twice, so it is written
/// to a temporary file first (in `$TMPDIR`) and removed after.
pub fn restore(
    store: &IndexedStore,
    podman: &Podman,
    image: &str,
    m: &Manifest,
    name: Option<&str>,
    progress: &dyn Progress,
) -> Result<ContainerRestoreReport> {
    let started = Instant::now();
    let c = check(podman, image, m, name)?;
    let tmp = tempfile::Builder::new()
        .prefix("gstore-restore-")
        .suffix(".tar")
        .tempfile()
        .map_err(|e| ContainerError::io("creating", std::env::temp_dir(), e))?;
    let written = archive::write_archive(
        store,
        m,
        std::io::BufWriter::with_capacity(1 << 20, tmp.as_file()),
        &tmp.path().display().to_string(),
        progress,
    )?;
    let archive_s = started.elapsed().as_secs_f64();
    let id = podman.restore_import(tmp.path(), name)?;
    let runtime_s = started.elapsed().as_secs_f64() - archive_s;
    Ok(ContainerRestoreReport {
        image: image.to_string(),
        container: name.unwrap_or(&c.name).to_string(),
        id,
        archive_bytes: written.tar_bytes,
        archive_s,
        runtime_s,
        total_s: started.elapsed().as_secs_f64(),
    })
}
