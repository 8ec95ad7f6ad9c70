//! The OCI image documents the registry reads and writes: pushed manifests parsed, and the
//! config and manifest of a checkpoint image generated from what the store keeps.

use crate::digest::Digest;
use crate::error::{RegistryError, Result};
use gstore_store::format::manifest::Manifest;
use serde_json::{json, Map, Value};

/// An OCI image manifest.
pub const MANIFEST_V1: &str = "application/vnd.oci.image.manifest.v1+json";
/// An OCI image config.
pub const CONFIG_V1: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed OCI layer: what a checkpoint image's layer is served as.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Docker's image manifest (schema 2), which podman and others also push.
pub const DOCKER_MANIFEST_V2: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The annotation podman marks a checkpoint image with (`podman container restore IMAGE`
/// looks for it).
pub const PODMAN_CHECKPOINT_RUNTIME: &str = "io.podman.annotations.checkpoint.runtime.name";
/// The annotation CRI-O marks a checkpoint image with.
pub const CRIO_CHECKPOINT_NAME: &str = "io.kubernetes.cri-o.annotations.checkpoint.name";

/// A blob a manifest names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Its digest.
    pub digest: Digest,
    /// Its length in bytes.
    pub size: u64,
}

/// A pushed image manifest, as far as the registry needs it.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// Its media type (its `mediaType`, else the request's Content-Type).
    pub media_type: String,
    /// The config blob.
    pub config: Descriptor,
    /// The layer blobs, in order.
    pub layers: Vec<Descriptor>,
    /// Its annotations.
    pub annotations: Map<String, Value>,
}

impl Pushed {
    /// Parses a pushed manifest. Image indexes (multi-platform lists) are refused.
    pub fn parse(bytes: &[u8], content_type: Option<&str>) -> Result<Pushed> {
        let invalid = |why: String| RegistryError::ManifestInvalid(format!("the manifest {why}"));
        let v: Value = serde_json::from_slice(bytes).map_err(|e| invalid(format!("is not JSON: {e}")))?;
        let media_type = v.get("mediaType").and_then(Value::as_str).or(content_type).unwrap_or(MANIFEST_V1).to_string();
        if v.get("manifests").is_some() || media_type.contains("index") || media_type.contains("list") {
            return Err(RegistryError::Unsupported(format!(
                "{media_type}: image indexes (multi-platform lists) are not kept yet; push one platform's image"
            )));
        }
        if media_type != MANIFEST_V1 && media_type != DOCKER_MANIFEST_V2 {
            return Err(RegistryError::Unsupported(format!(
                "manifest media type {media_type:?}: gstore keeps {MANIFEST_V1} and {DOCKER_MANIFEST_V2}"
            )));
        }
        let descriptor = |d: &Value, what: &str| -> Result<Descriptor> {
            let digest =
                d.get("digest").and_then(Value::as_str).ok_or_else(|| invalid(format!("{what} has no digest")))?;
            let size = d.get("size").and_then(Value::as_u64).ok_or_else(|| invalid(format!("{what} has no size")))?;
            Ok(Descriptor { digest: Digest::parse(digest)?, size })
        };
        let config = descriptor(v.get("config").ok_or_else(|| invalid("has no config".into()))?, "its config")?;
        let layers = v
            .get("layers")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("has no layers".into()))?
            .iter()
            .enumerate()
            .map(|(i, l)| descriptor(l, &format!("layer {i}")))
            .collect::<Result<Vec<_>>>()?;
        let annotations = v.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
        Ok(Pushed { media_type, config, layers, annotations })
    }

    /// Whether this is a container checkpoint image (podman's or CRI-O's annotation, one layer).
    pub fn is_checkpoint(&self) -> bool {
        self.layers.len() == 1
            && (self.annotations.contains_key(PODMAN_CHECKPOINT_RUNTIME)
                || self.annotations.contains_key(CRIO_CHECKPOINT_NAME))
    }
}

/// The config, manifest and layer of a checkpoint image as served: the layer is the image's
/// files as an uncompressed tar (the same bytes every time), and both documents are generated
/// from the image's metadata, so all three digests are fixed by what the store keeps.
#[derive(Clone, Debug)]
pub struct CheckpointImage {
    /// The config's bytes.
    pub config: Vec<u8>,
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// The layer's digest and length.
    pub layer: Descriptor,
}

impl CheckpointImage {
    /// The documents of checkpoint image `m` whose layer is `layer`.
    pub fn new(m: &Manifest, layer: Descriptor) -> CheckpointImage {
        let kept = m.meta.oci.as_ref();
        let diff_ids = json!([layer.digest.to_string()]);
        let config = match kept
            .and_then(|o| o.get("config"))
            .and_then(Value::as_str)
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
        {
            Some(Value::Object(mut c)) => {
                c.insert("rootfs".into(), json!({ "type": "layers", "diff_ids": diff_ids }));
                Value::Object(c)
            }
            _ => json!({
                "architecture": oci_arch(),
                "os": "linux",
                "config": {},
                "rootfs": { "type": "layers", "diff_ids": diff_ids },
            }),
        };
        let config = serde_json::to_vec(&config).expect("JSON values serialize");
        let annotations = match kept.and_then(|o| o.get("annotations")) {
            Some(Value::Object(a)) => a.clone(),
            _ => annotations_of(m),
        };
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_V1,
            "config": { "mediaType": CONFIG_V1, "digest": Digest::of(&config).to_string(), "size": config.len() },
            "layers": [{ "mediaType": LAYER_TAR, "digest": layer.digest.to_string(), "size": layer.size }],
            "annotations": annotations,
        });
        let manifest = serde_json::to_vec(&manifest).expect("JSON values serialize");
        CheckpointImage { config, manifest, layer }
    }
}

/// This machine's architecture as OCI names it.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The checkpoint annotations podman and CRI-O look for, from what `gstore checkpoint
/// --container` or `gstore push` recorded of the container.
fn annotations_of(m: &Manifest) -> Map<String, Value> {
    let c = m.meta.container.clone().unwrap_or_default();
    let runtime = if c.runtime.is_empty() { "runc".to_string() } else { c.runtime.clone() };
    let podman_version = m.meta.runtime.as_ref().map(|r| r.version.clone()).unwrap_or_default();
    let p = |k: &str| format!("io.podman.annotations.checkpoint.{k}");
    let mut a = Map::new();
    a.insert(p("name"), c.name.clone().into());
    a.insert(p("rawImageName"), c.image.clone().into());
    a.insert(p("rootfsImageName"), c.image.clone().into());
    a.insert(p("rootfsImageID"), c.image_id.clone().into());
    a.insert(p("runtime.name"), runtime.into());
    a.insert(p("criu.version"), criu_number(m.meta.criu_version.as_deref().unwrap_or_default()).into());
    a.insert(p("host.kernel"), m.meta.kernel.clone().unwrap_or_default().into());
    a.insert(p("host.arch"), oci_arch().into());
    a.insert(p("podman.version"), podman_version.into());
    a.insert(CRIO_CHECKPOINT_NAME.into(), c.name.into());
    a
}

/// CRIU's version as podman writes it: `4.1.1` as `40101`; anything else as it is.
fn criu_number(v: &str) -> String {
    let parts: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
    match parts[..] {
        [a, b] => format!("{}", a * 10000 + b * 100),
        [a, b, c] => format!("{}", a * 10000 + b * 100 + c),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(meta: Value) -> Manifest {
        let meta = serde_json::from_value(meta).unwrap();
        Manifest { created_unix: 1, meta, entries: vec![], chunks: vec![] }
    }

    #[test]
    fn pushed_manifests_are_read_and_indexes_refused() {
        let d = Digest::of(b"x").to_string();
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MANIFEST_V1}","config":{{"digest":"{d}","size":1}},"layers":[{{"digest":"{d}","size":1}}],"annotations":{{"{PODMAN_CHECKPOINT_RUNTIME}":"runc"}}}}"#
        );
        let p = Pushed::parse(m.as_bytes(), None).unwrap();
        assert!(p.is_checkpoint());
        assert_eq!(p.layers.len(), 1);
        let index = r#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(Pushed::parse(index.as_bytes(), None), Err(RegistryError::Unsupported(_))));
        assert!(matches!(Pushed::parse(b"{", None), Err(RegistryError::ManifestInvalid(_))));
        let no_layers = format!(r#"{{"config":{{"digest":"{d}","size":1}}}}"#);
        assert!(matches!(Pushed::parse(no_layers.as_bytes(), None), Err(RegistryError::ManifestInvalid(_))));
    }

    #[test]
    fn checkpoint_documents_are_generated_from_the_metadata_alone() {
        let layer = Descriptor { digest: Digest::of(b"layer"), size: 5 };
        let m = manifest(json!({
            "kind": "container-checkpoint",
            "container": { "name": "web", "image": "localhost/bb:1", "image_id": "2627", "runtime": "runc" },
            "criu_version": "4.1.1",
        }));
        let a = CheckpointImage::new(&m, layer.clone());
        let b = CheckpointImage::new(&m, layer.clone());
        assert_eq!((&a.config, &a.manifest), (&b.config, &b.manifest));
        let man: Value = serde_json::from_slice(&a.manifest).unwrap();
        let ann = &man["annotations"];
        assert_eq!(ann[PODMAN_CHECKPOINT_RUNTIME], "runc");
        assert_eq!(ann["io.podman.annotations.checkpoint.rootfsImageID"], "2627");
        assert_eq!(ann["io.podman.annotations.checkpoint.criu.version"], "40101");
        assert_eq!(man["config"]["digest"], Digest::of(&a.config).to_string());
        let config: Value = serde_json::from_slice(&a.config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer.digest.to_string());

        // A pushed image's config is kept, its layer's diff id replaced.
        let kept = manifest(json!({ "oci": { "config": "{\"os\":\"linux\",\"rootfs\":{\"diff_ids\":[\"sha256:00\"]}}",
                                              "annotations": { "a": "b" } } }));
        let c = CheckpointImage::new(&kept, layer.clone());
        let config: Value = serde_json::from_slice(&c.config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"], json!([layer.digest.to_string()]));
        assert_eq!(serde_json::from_slice::<Value>(&c.manifest).unwrap()["annotations"], json!({ "a": "b" }));
    }
}
