//! An image's metadata (the manifest's `meta` object, docs/FORMAT.md), typed: [`ImageMeta`]
//! has a field for every key gstore writes, and keeps every other key as it was. It is
//! written as a JSON object with its keys in byte order, the same bytes as the map it replaces,
//! so a manifest read and written again keeps its id.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What an image holds (key `kind`); none for a plain tree of files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A process checkpoint with CUDA state: its restore needs a compatible GPU machine.
    GpuProcess,
    /// A CPU-only process checkpoint: CRIU alone restores it.
    CpuProcess,
    /// A container checkpoint (podman's archive, or runc's images and bundle configuration).
    ContainerCheckpoint,
    /// An image the registry keeps as an OCI layout.
    OciImage,
    /// A kind this version does not know, kept as written.
    Other(String),
}

impl Kind {
    /// The name written under `kind`.
    pub fn as_str(&self) -> &str {
        match self {
            Kind::GpuProcess => "gpu-process",
            Kind::CpuProcess => "cpu-process",
            Kind::ContainerCheckpoint => "container-checkpoint",
            Kind::OciImage => "oci-image",
            Kind::Other(name) => name,
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Kind {
        [Kind::GpuProcess, Kind::CpuProcess, Kind::ContainerCheckpoint, Kind::OciImage]
            .into_iter()
            .find(|k| k.as_str() == name)
            .unwrap_or_else(|| Kind::Other(name.to_string()))
    }

    /// A process checkpoint, with or without CUDA state.
    pub fn is_process(&self) -> bool {
        matches!(self, Kind::GpuProcess | Kind::CpuProcess)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Kind, D::Error> {
        String::deserialize(d).map(|name| Kind::parse(&name))
    }
}

/// A GPU of the machine that captured a process (key `gpus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The device ordinal (as the driver enumerates it in this process).
    pub index: u32,
    /// The device name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub total_mem_bytes: u64,
    /// The GPU's UUID as `nvidia-smi -L` prints it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`);
    /// absent in images captured before gstore recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// Seconds spent in each capture phase (key `capture_timings`); `None` for phases that did not
/// run. With several GPU processes, each GPU phase is timed from its start for all of them to
/// its end for the last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaptureTimings {
    /// `cuCheckpointProcessLock`.
    pub lock_s: Option<f64>,
    /// `cuCheckpointProcessCheckpoint` (GPU memory → host memory).
    pub gpu_checkpoint_s: Option<f64>,
    /// `criu dump`.
    pub criu_dump_s: f64,
    /// Restore + unlock after a `--leave-running` dump.
    pub gpu_resume_s: Option<f64>,
}

/// The container runtime that checkpointed a container (key `runtime`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    /// `podman` or `runc`.
    pub engine: String,
    /// What its `--version` said.
    pub version: String,
}

/// The container a checkpoint is of, as its runtime described it (key `container`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMeta {
    /// The container's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The container's id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The image it was created from, by name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// That image's id: the runtime needs it present to restore.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
    /// The OCI runtime that ran it (runc, crun).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runtime: String,
}

/// What the restore of a container checkpointed through runc needs (key `runc`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuncMeta {
    /// The bundle directory it ran from (and is restored from).
    pub bundle: PathBuf,
    /// Its root filesystem.
    pub rootfs: PathBuf,
}

/// The archive a node agent stored an image from (key `source_archive`): what makes the same
/// archive found again recognisable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceArchive {
    /// Its file name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, in nanoseconds since the Unix epoch (decimal).
    pub modified_ns: String,
}

/// Reads a known key's value as `T` when `T` writes it back exactly as it was (otherwise it is
/// kept as written, under [`ImageMeta::other`]).
fn exact<T: Serialize + for<'de> Deserialize<'de>>(v: &Value) -> Option<T> {
    let t: T = serde_json::from_value(v.clone()).ok()?;
    (serde_json::to_value(&t).ok()? == *v).then_some(t)
}

macro_rules! image_meta {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty = $key:literal,)*) => {
        /// An image's metadata: every key gstore writes, typed (absent: not written), and any
        /// other key as written. A known key whose value has another shape than gstore writes
        /// is kept under [`ImageMeta::other`] too, so nothing read is lost.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct ImageMeta {
            $($(#[doc = $doc])* pub $field: Option<$ty>,)*
            /// Every other key, as written.
            pub other: BTreeMap<String, Value>,
        }

        impl ImageMeta {
            /// The keys gstore writes, in the order [`ImageMeta`] lists them.
            pub const KEYS: &'static [&'static str] = &[$($key),*];

            /// The metadata that `map` writes.
            pub fn from_map(map: BTreeMap<String, Value>) -> ImageMeta {
                let mut meta = ImageMeta::default();
                for (key, value) in map {
                    match key.as_str() {
                        $($key => if let Some(t) = exact::<$ty>(&value) {
                            meta.$field = Some(t);
                            continue;
                        },)*
                        _ => {}
                    }
                    meta.other.insert(key, value);
                }
                meta
            }

            /// The map it is written as.
            pub fn to_map(&self) -> BTreeMap<String, Value> {
                let mut map = self.other.clone();
                $(if let Some(v) = &self.$field {
                    map.insert($key.to_string(), serde_json::to_value(v).expect("metadata values serialize"));
                })*
                map
            }

            /// `more` laid over this: its fields and other keys replace these.
            pub fn extend(&mut self, more: ImageMeta) {
                $(if more.$field.is_some() {
                    self.$field = more.$field;
                })*
                self.other.extend(more.other);
            }
        }
    };
}

image_meta! {
    /// What the image holds.
    kind: Kind = "kind",
    /// The tag this image was pushed on top of (`NAME:VERSION`): its chunks are the first
    /// candidates for page-level deltas.
    parent: String = "parent",
    /// Whether the process (or container) kept running after the checkpoint.
    leave_running: bool = "leave_running",
    /// The CRIU version that dumped the image.
    criu_version: String = "criu_version",
    /// The established TCP connections the dump holds (CRIU's `--tcp-established`), where
    /// it holds any: its restore needs that option too.
    tcp_connections: TcpConnections = "tcp_connections",
    /// The kernel release of the capturing machine.
    kernel: String = "kernel",
    /// The manifest ids (hex) of the images this image needs to be restored (a process image
    /// whose weights are left out names the model image they come from); gc keeps them, their
    /// chunks included, for as long as it keeps this image.
    uses: Vec<String> = "uses",
    /// A recorded access order: entry paths, most urgent first; entries it does not name
    /// follow in manifest order.
    access_order: Vec<String> = "access_order",
    /// The checkpointed process (the root of the dumped tree), by its pid when dumped.
    pid: u32 = "pid",
    /// The CUDA driver version (`MAJOR.MINOR`) of the capturing machine.
    cuda_driver_version: String = "cuda_driver_version",
    /// The GPUs of the capturing machine.
    gpus: Vec<GpuInfo> = "gpus",
    /// The processes whose GPU state was checkpointed (pids when dumped).
    gpu_pids: Vec<u32> = "gpu_pids",
    /// How long each capture phase took.
    capture_timings: CaptureTimings = "capture_timings",
    /// The registrations of the processes whose weights the image leaves out, a list
    /// (their shape is `gstore_capture::cooperate`'s).
    released_weights: Value = "released_weights",
    /// The container runtime that checkpointed the container.
    runtime: Runtime = "runtime",
    /// The container a checkpoint is of.
    container: ContainerMeta = "container",
    /// What a runc restore needs.
    runc: RuncMeta = "runc",
    /// The archive a node agent stored the image from.
    source_archive: SourceArchive = "source_archive",
    /// What a pushed checkpoint image's documents said (`{"config", "annotations"}`: its
    /// config, as text, and its manifest's annotations), or a layout image's manifest
    /// (`{"media_type", "manifest"}`: its media type and digest); the registry's.
    oci: Value = "oci",
}

/// Which established TCP connections a process image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TcpConnections {
    /// Every one is between the dumped tree's own processes: a restore brings both ends back
    /// together, so no network lock is needed around it.
    Inside,
    /// Some lead to processes outside the tree (dumped because the user asked).
    Outside,
}

impl ImageMeta {
    /// Whether it says nothing.
    pub fn is_empty(&self) -> bool {
        self.to_map().is_empty()
    }

    /// Metadata saying only what the image holds.
    pub fn of_kind(kind: Kind) -> ImageMeta {
        ImageMeta { kind: Some(kind), ..ImageMeta::default() }
    }
}

impl Serialize for ImageMeta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_map().serialize(s)
    }
}

impl<'de> Deserialize<'de> for ImageMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ImageMeta, D::Error> {
        BTreeMap::<String, Value>::deserialize(d).map(ImageMeta::from_map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_keys_are_typed_and_others_kept_byte_for_byte() {
        let text = r#"{"capture_timings":{"criu_dump_s":0.25,"gpu_checkpoint_s":null,"gpu_resume_s":null,"lock_s":0.1},"gpus":[{"index":0,"name":"NVIDIA H200","total_mem_bytes":150000000000}],"kind":"gpu-process","mine":{"a":[1,2]},"pid":42,"runc":{"bundle":"/b","rootfs":"/b/rootfs"}}"#;
        let meta: ImageMeta = serde_json::from_str(text).unwrap();
        assert_eq!(meta.kind, Some(Kind::GpuProcess));
        assert_eq!(meta.pid, Some(42));
        assert_eq!(meta.gpus.as_ref().unwrap()[0].name, "NVIDIA H200");
        assert_eq!(meta.capture_timings.as_ref().unwrap().criu_dump_s, 0.25);
        assert_eq!(meta.runc.as_ref().unwrap().rootfs, PathBuf::from("/b/rootfs"));
        assert_eq!(meta.other.keys().collect::<Vec<_>>(), ["mine"]);
        assert_eq!(serde_json::to_string(&meta).unwrap(), text, "written back as it was read");
    }

    #[test]
    fn a_known_key_of_another_shape_is_kept_as_written() {
        let text = r#"{"gpu_pids":"seven","kind":"files","pid":-1,"uses":["ab",3]}"#;
        let meta: ImageMeta = serde_json::from_str(text).unwrap();
        assert_eq!(meta.kind, Some(Kind::Other("files".into())));
        assert!(meta.gpu_pids.is_none() && meta.pid.is_none() && meta.uses.is_none());
        assert_eq!(meta.other["gpu_pids"], "seven");
        assert_eq!(serde_json::to_string(&meta).unwrap(), text);
    }

    #[test]
    fn extending_replaces_what_the_other_says() {
        let mut meta = ImageMeta::of_kind(Kind::CpuProcess);
        meta.parent = Some("a:1".into());
        meta.other.insert("x".into(), json!(1));
        let mut more = ImageMeta::of_kind(Kind::ContainerCheckpoint);
        more.other.insert("x".into(), json!(2));
        meta.extend(more);
        assert_eq!(meta.kind, Some(Kind::ContainerCheckpoint));
        assert_eq!(meta.parent.as_deref(), Some("a:1"));
        assert_eq!(meta.other["x"], 2);
    }

    #[test]
    fn every_key_is_named_once() {
        let mut keys = ImageMeta::KEYS.to_vec();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), ImageMeta::KEYS.len());
    }
}
