//! `gstore load`: restore an image's files straight into memory — host or GPUs — and report
//! the throughput. `--check` reads device buffers back and checks every chunk's hash
//! ([`DeviceImage::read_back_and_check`]).

use crate::output::rate;
use anyhow::{bail, Context, Result};
use gstore_gpu_dump::cuda::Context as CudaContext;
use gstore_gpu_dump::CudaDriver;
use gstore_progress::Bars;
use gstore_restore::{DeviceImage, Spread, TransferWaits};
use gstore_store::format::manifest::Manifest;
use gstore_store::{IndexedStore, StoreError};
use indicatif::HumanBytes;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What `gstore load` reports.
#[derive(Serialize)]
pub struct LoadReport {
    /// The image loaded.
    pub image: String,
    /// `host`, or the devices: `cuda:N[,cuda:M...]`.
    pub device: String,
    /// Bytes placed in memory (on all devices together).
    pub bytes: u64,
    /// Seconds from the start of the command's work to the last byte checked in memory.
    pub seconds: f64,
    /// bytes / seconds, in GB/s.
    pub gb_per_s: f64,
    /// Whether the device copy was read back and checked.
    pub checked: bool,
    /// Device loads: seconds planning, allocating, transferring (the slowest device's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<[f64; 3]>,
    /// Device loads: seconds from the start of the command's work until the CUDA context was
    /// up (the slowest device's); no byte can cross to the device before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_s: Option<f64>,
    /// Device loads: where chunks were checked and decoded, and why there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Device loads: where the transfer's workers spent their time (the slowest device's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits: Option<TransferWaits>,
    /// Loads onto several devices: the bytes each holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_device: Option<Vec<DeviceShare>>,
}

/// One device's part of a multi-device load.
#[derive(Serialize)]
pub struct DeviceShare {
    /// `cuda:N`.
    pub device: String,
    /// Bytes it holds.
    pub bytes: u64,
}

/// Where `--device` puts the image.
enum Target {
    Host,
    Cuda(Vec<u32>),
    AllCuda,
}

fn parse_target(device: &str) -> Result<Target> {
    match device {
        "host" => Ok(Target::Host),
        "all" => Ok(Target::AllCuda),
        list => list
            .split(',')
            .map(|d| d.trim().strip_prefix("cuda:").and_then(|n| n.parse::<u32>().ok()))
            .collect::<Option<Vec<u32>>>()
            .map(Target::Cuda)
            .with_context(|| format!("--device {device:?}: expected host, all, or cuda:N[,cuda:M...]")),
    }
}

/// The one GPU `device` names (`cuda:N`): held loads and `gstore hold` serve one device.
pub fn single_device(device: &str) -> Result<u32> {
    match parse_target(device) {
        Ok(Target::Cuda(list)) if list.len() == 1 => Ok(list[0]),
        _ => bail!("--device {device:?}: expected cuda:N (one GPU)"),
    }
}

/// Opens the store and reads the manifest of `reference` with `open`, and loads it onto `device` (`host`, `cuda:N`, a
/// comma-separated list of GPUs, or `all` of them), split across several GPUs or, with
/// `replicate`, whole on each. The CUDA driver and contexts start while the store opens and
/// the image is planned; the time reported runs from the call to the last byte checked.
pub fn load(
    open: impl FnOnce() -> Result<(IndexedStore, Manifest)>,
    reference: &str,
    device: &str,
    check: bool,
    replicate: bool,
    memory_budget: u64,
    bars: &Bars,
) -> Result<LoadReport> {
    let started = Instant::now();
    let devices = match parse_target(device)? {
        Target::Host => {
            if check {
                bail!("--check reads device memory back; host loads are verified chunk by chunk already");
            }
            let (store, m) = open()?;
            let bytes =
                gstore_restore::restore_to_memory(&store, &m, gstore_restore::Budget::of(memory_budget), bars)?.len();
            return Ok(report(reference, device, bytes, started.elapsed().as_secs_f64()));
        }
        Target::Cuda(list) => list,
        Target::AllCuda => {
            let n = CudaDriver::load()?.devices()?.len() as u32;
            if n == 0 {
                bail!("--device all: the CUDA driver sees no GPU");
            }
            (0..n).collect()
        }
    };
    let contexts: Vec<_> = devices
        .iter()
        .map(|&index| {
            std::thread::spawn(move || {
                let ctx = CudaDriver::load()?.context(index);
                ctx.map(|c| (c, started.elapsed().as_secs_f64()))
            })
        })
        .collect();
    let (store, m) = open()?;
    let context_s = std::sync::Mutex::new(0.0f64);
    let open_contexts: Vec<_> = contexts
        .into_iter()
        .map(|starting| {
            let context_s = &context_s;
            move || -> gstore_store::Result<CudaContext> {
                let (ctx, up) = starting.join().expect("CUDA start does not panic").map_err(StoreError::device)?;
                let mut slowest = context_s.lock().expect("no panic while held");
                *slowest = slowest.max(up);
                Ok(ctx)
            }
        })
        .collect();
    let spread = if replicate { Spread::Replicate } else { Spread::Split };
    let images = gstore_restore::restore_to_devices(
        &store,
        &m,
        open_contexts,
        spread,
        gstore_restore::Budget::of(memory_budget),
        bars,
    )?;
    let bytes = images.iter().map(DeviceImage::len).sum();
    let mut r = report(reference, device, bytes, started.elapsed().as_secs_f64());
    let slowest = |f: fn(&DeviceImage) -> f64| images.iter().map(f).fold(0.0, f64::max);
    r.phases = Some([slowest(|i| i.plan_s), slowest(|i| i.alloc_s), slowest(|i| i.transfer_s)]);
    r.context_s = Some(context_s.into_inner().expect("no panic while held"));
    r.path = images.first().map(|i| i.path.clone());
    r.waits = images.iter().max_by(|a, b| a.transfer_s.total_cmp(&b.transfer_s)).map(|i| i.waits);
    if images.len() > 1 {
        r.device = devices.iter().map(|d| format!("cuda:{d}")).collect::<Vec<_>>().join(",");
        r.per_device = Some(
            devices
                .iter()
                .zip(&images)
                .map(|(d, i)| DeviceShare { device: format!("cuda:{d}"), bytes: i.len() })
                .collect(),
        );
    }
    if check {
        for image in &images {
            image.read_back_and_check(&m, &store.chunk_ids())?;
        }
        r.checked = true;
    }
    Ok(r)
}

/// Loads `reference` onto `device` (one GPU) from the `gstore hold` at `socket`, which fills
/// and checks the buffers this process allocates. With `check`, `open` gives the store and
/// manifest to read the buffers back against.
pub fn load_held(
    open: impl FnOnce() -> Result<(IndexedStore, Manifest)>,
    reference: &str,
    device: &str,
    check: bool,
    socket: &Path,
) -> Result<LoadReport> {
    let started = Instant::now();
    let ctx = CudaDriver::load()?.context(single_device(device)?)?;
    let image = gstore_restore::load_held(socket, reference, &ctx)?;
    let mut r = report(reference, device, image.len(), started.elapsed().as_secs_f64());
    r.phases = Some([image.plan_s, image.alloc_s, image.transfer_s]);
    r.path = Some(image.path.clone());
    if check {
        let (store, m) = open()?;
        image.read_back_and_check(&m, &store.chunk_ids())?;
        r.checked = true;
    }
    Ok(r)
}

fn report(image: &str, device: &str, bytes: u64, seconds: f64) -> LoadReport {
    LoadReport {
        image: image.to_string(),
        device: device.to_string(),
        bytes,
        seconds,
        gb_per_s: bytes as f64 / 1e9 / seconds.max(1e-9),
        checked: false,
        phases: None,
        context_s: None,
        path: None,
        waits: None,
        per_device: None,
    }
}

/// `gstore load`'s summary.
pub(crate) fn load_text(r: &LoadReport) -> String {
    format!(
        "loaded {} into {} in {:.2} s: {}{}{}{}{}",
        HumanBytes(r.bytes),
        r.device,
        r.seconds,
        rate(r.bytes, r.seconds),
        r.phases
            .map(|[p, a, t]| format!(" (plan {p:.2} s, allocate {a:.2} s, transfer {t:.2} s: {})", rate(r.bytes, t)))
            .unwrap_or_default(),
        if r.checked { " (read back and checked)" } else { "" },
        r.per_device.iter().flatten().map(|d| format!("\n{}: {}", d.device, HumanBytes(d.bytes))).collect::<String>(),
        r.path.as_deref().map(|p| format!("\n{p}")).unwrap_or_default()
    )
}
