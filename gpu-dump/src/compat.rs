//! Whether an image can be restored on this machine, decided from the metadata recorded at
//! capture before anything is touched.

use crate::checkpoint::ImageKind;
use crate::criu::{self, Criu};
use crate::cuda::ffi::GpuPair;
use crate::cuda::{CudaDriver, GpuInfo};
use crate::error::{GpuDumpError, Result};
use crate::gpumap::{self, GpuMap};
use gstore_format::meta::ImageMeta;

/// What a process image needs to be restored, as recorded at capture
/// ([`crate::checkpoint::CaptureReport::metadata`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageNeeds {
    /// GPU or CPU-only process.
    pub kind: ImageKind,
    /// The CRIU version that dumped it.
    pub criu_version: String,
    /// The driver's CUDA version (major, minor) at capture; GPU images only.
    pub cuda_driver_version: Option<(u32, u32)>,
    /// The capturing machine's GPUs; empty for CPU images.
    pub gpus: Vec<GpuInfo>,
    /// The processes whose GPU state was checkpointed; empty for CPU images and for GPU
    /// images captured before process trees were (their root alone).
    pub gpu_pids: Vec<u32>,
}

impl ImageNeeds {
    /// Reads them from an image's metadata; GPU images must carry the driver version and the
    /// GPU list.
    pub fn from_metadata(meta: &ImageMeta) -> Result<ImageNeeds> {
        let kind = need(meta.kind.as_ref(), meta, "kind")?;
        let kind = ImageKind::of(kind).ok_or_else(|| GpuDumpError::Metadata {
            key: "kind",
            detail: format!("{:?} is not a process image (expected gpu-process or cpu-process)", kind.as_str()),
        })?;
        let criu_version = need(meta.criu_version.as_ref(), meta, "criu_version")?.clone();
        let (cuda_driver_version, gpus, gpu_pids) = match kind {
            ImageKind::CpuProcess => (None, Vec::new(), Vec::new()),
            ImageKind::GpuProcess => {
                let version = need(meta.cuda_driver_version.as_ref(), meta, "cuda_driver_version")?;
                let (major, minor, _) = criu::parse_version(version).ok_or_else(|| GpuDumpError::Metadata {
                    key: "cuda_driver_version",
                    detail: format!("{version:?} is not \"major.minor\""),
                })?;
                let gpus = need(meta.gpus.as_ref(), meta, "gpus")?.clone();
                let gpu_pids = match meta.gpu_pids.as_ref() {
                    // Images of before process trees do not say: their root alone.
                    None if !meta.other.contains_key("gpu_pids") => Vec::new(),
                    pids => need(pids, meta, "gpu_pids")?.clone(),
                };
                (Some((major, minor)), gpus, gpu_pids)
            }
        };
        Ok(ImageNeeds { kind, criu_version, cuda_driver_version, gpus, gpu_pids })
    }
}

/// The metadata field under `key`, or an error saying that it is missing or is not what gstore
/// writes there (kept aside by [`ImageMeta`]).
fn need<'a, T>(field: Option<&'a T>, meta: &ImageMeta, key: &'static str) -> Result<&'a T> {
    field.ok_or_else(|| GpuDumpError::Metadata {
        key,
        detail: match meta.other.get(key) {
            Some(v) => format!("{v} is not what gstore checkpoint writes there"),
            None => "missing (was this image captured by gstore checkpoint?)".to_string(),
        },
    })
}

/// What this machine offers for a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// The local CRIU version, if one was found.
    pub criu_version: Option<String>,
    /// The local CUDA driver's version (major, minor) and GPUs, or why there is none.
    pub cuda: std::result::Result<((u32, u32), Vec<GpuInfo>), String>,
}

impl MachineInfo {
    /// Asks the local CRIU and CUDA driver (`cuda` is the outcome of [`CudaDriver::load`]).
    pub fn probe(criu: Option<&Criu>, cuda: &Result<CudaDriver>) -> MachineInfo {
        let cuda = match cuda {
            Ok(driver) => {
                driver.driver_version().and_then(|version| Ok((version, driver.devices()?))).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        MachineInfo { criu_version: criu.map(Criu::version), cuda }
    }

    /// Asks the local CRIU only, for an image that needs no GPU: the CUDA driver is not
    /// started (its `cuInit` alone costs a GPU machine about 0.2 s).
    pub fn probe_without_gpus(criu: Option<&Criu>) -> MachineInfo {
        MachineInfo { criu_version: criu.map(Criu::version), cuda: Err("not asked: the image needs no GPU".into()) }
    }
}

/// The GPU pairs to restore `image` with on `machine` (empty: onto the GPUs it was captured
/// on, or a CPU image), or [`GpuDumpError::Incompatible`] with the reason: no CRIU >= 4.0
/// here; a GPU image but no CUDA driver; an older driver major version than at capture; GPUs
/// that cannot be placed by [`crate::gpumap`]'s rule (`map` may be empty).
pub fn check_compatible(image: &ImageNeeds, machine: &MachineInfo, map: &GpuMap) -> Result<Vec<GpuPair>> {
    let refuse = |reason: String| Err(GpuDumpError::Incompatible { reason });
    match machine.criu_version.as_deref() {
        None => return refuse("no CRIU here; install CRIU >= 4.0 with scripts/criu.sh".to_string()),
        Some(v) if criu::parse_version(v).is_some_and(|(major, _, _)| major >= 4) => {}
        Some(v) => return refuse(format!("the local CRIU is {v}; restoring needs CRIU >= 4.0 (scripts/criu.sh)")),
    }
    if image.kind == ImageKind::CpuProcess {
        if !map.entries.is_empty() {
            return refuse("--gpu-map was given, but it is a CPU image".to_string());
        }
        return Ok(Vec::new());
    }
    let ((major, minor), gpus) = match &machine.cuda {
        Ok(cuda) => cuda,
        Err(why) => return refuse(format!("it is a GPU image but this machine has no usable CUDA driver: {why}")),
    };
    if let Some((want_major, want_minor)) = image.cuda_driver_version {
        if *major < want_major {
            return refuse(format!(
                "it was captured under a driver for CUDA {want_major}.{want_minor}; this machine's driver \
                 supports CUDA {major}.{minor}; upgrade the NVIDIA driver to a CUDA {want_major}.x one"
            ));
        }
    }
    let incompatible = |reason: String| GpuDumpError::Incompatible { reason };
    let placed = gpumap::place(&image.gpus, gpus, map).map_err(incompatible)?;
    gpumap::pairs(&placed, (*major, *minor)).map_err(incompatible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CaptureReport, CaptureTimings};
    use gstore_format::meta::Kind;

    fn h200(index: u32) -> GpuInfo {
        GpuInfo { index, name: "NVIDIA H200".into(), total_mem_bytes: 150_754_820_096, uuid: None }
    }

    fn gpu_image() -> ImageNeeds {
        ImageNeeds {
            kind: ImageKind::GpuProcess,
            criu_version: "4.1.1".into(),
            cuda_driver_version: Some((13, 0)),
            gpus: vec![h200(0), h200(1)],
            gpu_pids: vec![7, 9],
        }
    }

    fn cpu_image() -> ImageNeeds {
        ImageNeeds {
            kind: ImageKind::CpuProcess,
            cuda_driver_version: None,
            gpus: vec![],
            gpu_pids: vec![],
            ..gpu_image()
        }
    }

    fn gpu_machine() -> MachineInfo {
        MachineInfo { criu_version: Some("4.1.1".into()), cuda: Ok(((13, 0), vec![h200(0), h200(1)])) }
    }

    fn refusal(image: &ImageNeeds, machine: &MachineInfo) -> String {
        let err = check_compatible(image, machine, &GpuMap::default()).expect_err("must be refused");
        assert!(matches!(err, GpuDumpError::Incompatible { .. }), "{err:?}");
        err.to_string()
    }

    #[test]
    fn same_machine_is_compatible_and_newer_driver_too() {
        assert!(check_compatible(&gpu_image(), &gpu_machine(), &GpuMap::default()).expect("same machine").is_empty());
        let newer = MachineInfo { cuda: Ok(((13, 2), vec![h200(0), h200(1), h200(2)])), ..gpu_machine() };
        check_compatible(&gpu_image(), &newer, &GpuMap::default()).expect("newer driver, more GPUs");
    }

    #[test]
    fn gpu_image_needs_a_driver() {
        let no_driver = MachineInfo { cuda: Err("no CUDA driver (libcuda.so.1) found: x".into()), ..gpu_machine() };
        let msg = refusal(&gpu_image(), &no_driver);
        assert!(msg.contains("GPU image but this machine has no usable CUDA driver: no CUDA driver"), "{msg}");
    }

    #[test]
    fn older_driver_fewer_gpus_other_model_less_memory_are_refused() {
        let old = MachineInfo { cuda: Ok(((12, 8), vec![h200(0), h200(1)])), ..gpu_machine() };
        assert!(refusal(&gpu_image(), &old).contains("CUDA 13.0") && refusal(&gpu_image(), &old).contains("CUDA 12.8"));
        let one = MachineInfo { cuda: Ok(((13, 0), vec![h200(0)])), ..gpu_machine() };
        assert!(refusal(&gpu_image(), &one).contains("image GPU 1 (NVIDIA H200"));
        let h100 =
            GpuInfo { index: 1, name: "NVIDIA H100 80GB HBM3".into(), total_mem_bytes: 85_000_000_000, uuid: None };
        let mixed = MachineInfo { cuda: Ok(((13, 0), vec![h200(0), h100])), ..gpu_machine() };
        let msg = refusal(&gpu_image(), &mixed);
        assert!(msg.contains("image GPU 1") && msg.contains("1: NVIDIA H100 80GB HBM3"), "{msg}");
        let small = GpuInfo { total_mem_bytes: 1, ..h200(1) };
        let small = MachineInfo { cuda: Ok(((13, 0), vec![h200(0), small])), ..gpu_machine() };
        assert!(refusal(&gpu_image(), &small).contains("1: NVIDIA H200, 1 bytes"));
    }

    #[test]
    fn a_machine_probed_without_gpus_restores_cpu_images_only() {
        let machine = MachineInfo::probe_without_gpus(None);
        assert_eq!(machine.criu_version, None);
        let machine = MachineInfo { criu_version: Some("4.1.1".into()), ..machine };
        let cpu = cpu_image();
        check_compatible(&cpu, &machine, &GpuMap::default()).expect("a CPU image needs no GPU");
        refusal(&gpu_image(), &machine);
    }

    #[test]
    fn criu_must_be_there_and_new() {
        let cpu = cpu_image();
        let none = MachineInfo { criu_version: None, cuda: Err("none".into()) };
        assert!(refusal(&cpu, &none).contains("scripts/criu.sh"));
        let old = MachineInfo { criu_version: Some("3.17.1".into()), cuda: Err("none".into()) };
        assert!(refusal(&cpu, &old).contains("the local CRIU is 3.17.1"));
        let ok = MachineInfo { criu_version: Some("4.2.1".into()), cuda: Err("none".into()) };
        check_compatible(&cpu, &ok, &GpuMap::default()).expect("a CPU image needs no GPU");
        let map = GpuMap::parse("0=0").unwrap();
        assert!(check_compatible(&cpu, &ok, &map).unwrap_err().to_string().contains("it is a CPU image"));
    }

    #[test]
    fn metadata_round_trip_from_a_capture_report() {
        let report = CaptureReport {
            pid: 7,
            gpu_pids: vec![7, 9],
            image_kind: ImageKind::GpuProcess,
            leave_running: false,
            criu_version: "4.1.1".into(),
            tcp_connections: None,
            cuda_driver_version: Some("13.0".into()),
            gpus: vec![h200(0), h200(1)],
            timings: CaptureTimings::default(),
            extra: Default::default(),
        };
        assert_eq!(ImageNeeds::from_metadata(&report.metadata()).expect("parse"), gpu_image());
        let mut meta = report.metadata();
        meta.gpu_pids = None;
        let before_trees = ImageNeeds::from_metadata(&meta).expect("an image of before process trees");
        assert!(before_trees.gpu_pids.is_empty(), "its root alone");
        let meta = ImageMeta::from_map(
            [("gpu_pids".to_string(), serde_json::json!("seven"))].into_iter().chain(meta.to_map()).collect(),
        );
        let err = ImageNeeds::from_metadata(&meta).expect_err("pids not a list");
        assert!(err.to_string().contains("\"gpu_pids\""), "{err}");
        let err = ImageNeeds::from_metadata(&ImageMeta { gpus: None, ..meta.clone() }).expect_err("no gpus");
        assert!(err.to_string().contains("\"gpus\": missing"), "{err}");
        let files = ImageMeta { kind: Some(Kind::Other("files".into())), ..meta };
        let err = ImageNeeds::from_metadata(&files).expect_err("not a process image");
        assert!(err.to_string().contains("not a process image"), "{err}");
        let err = ImageNeeds::from_metadata(&ImageMeta::default()).expect_err("empty");
        assert!(err.to_string().contains("\"kind\": missing"), "{err}");
    }
}
