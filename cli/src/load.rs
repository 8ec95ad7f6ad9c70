//! `gstore load`: restore an image's files straight into memory — host or GPU — and report
//! the throughput. `--check` reads device buffers back and checks every chunk's hash.

use crate::progress::Bars;
use anyhow::{bail, Context, Result};
use gstore_gpu_dump::CudaDriver;
use gstore_store::{ObjectId, Store};
use serde::Serialize;
use std::time::Instant;

/// What `gstore load` reports.
#[derive(Serialize)]
pub struct LoadReport {
    /// The image loaded.
    pub image: String,
    /// `host` or `cuda:N`.
    pub device: String,
    /// Bytes placed in memory.
    pub bytes: u64,
    /// Seconds to place them (allocation included).
    pub seconds: f64,
    /// bytes / seconds, in GB/s.
    pub gb_per_s: f64,
    /// Whether the device copy was read back and checked.
    pub checked: bool,
    /// Device loads: seconds planning, allocating, transferring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<[f64; 3]>,
    /// Device loads: where chunks were checked and decoded, and why there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Opens the store with `open` and loads `reference` onto `device` (`host` or `cuda:N`). The
/// CUDA driver and context start while the store opens and the image is read; the time
/// reported runs from the call to the last byte checked in memory.
pub fn load(
    open: impl FnOnce() -> Result<Store>,
    reference: &str,
    device: &str,
    check: bool,
    memory_budget: u64,
    bars: &Bars,
) -> Result<LoadReport> {
    let started = Instant::now();
    let gpu = match device {
        "host" => None,
        _ => Some(
            device
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<u32>().ok())
                .with_context(|| format!("--device {device:?}: expected host or cuda:N"))?,
        ),
    };
    if gpu.is_none() && check {
        bail!("--check reads device memory back; host loads are verified chunk by chunk already");
    }
    let context =
        gpu.map(|index| std::thread::spawn(move || Ok::<_, anyhow::Error>(CudaDriver::load()?.context(index)?)));
    let store = open()?;
    let id = store.resolve(reference)?;
    let m = store.get_manifest(&id)?;
    let Some(context) = context else {
        let bytes = gstore_restore::restore_to_memory(&store, &m, memory_budget, bars)?.len();
        return Ok(report(reference, device, bytes, started.elapsed().as_secs_f64()));
    };
    let ctx = context.join().expect("CUDA start does not panic")?;
    let image = gstore_restore::restore_to_device(&store, &m, &ctx, memory_budget, bars)?;
    let mut r = report(reference, device, image.len(), started.elapsed().as_secs_f64());
    r.phases = Some([image.plan_s, image.alloc_s, image.transfer_s]);
    r.path = Some(image.path.clone());
    if check {
        check_device(&m, &image, &ctx)?;
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
        path: None,
    }
}

/// Copies every device buffer back and checks each chunk's BLAKE3 against the manifest.
fn check_device(
    m: &gstore_store::manifest::Manifest,
    image: &gstore_restore::DeviceImage,
    ctx: &gstore_gpu_dump::cuda::Context,
) -> Result<()> {
    let mut loaded = image.entries.iter();
    for (entry, chunks) in m.files().filter(|(e, _)| e.kind == gstore_store::manifest::EntryKind::File) {
        let dev = loaded.next().context("fewer device buffers than files")?;
        let mut host = vec![0u8; dev.buffer.len()];
        ctx.copy_to_host(&mut host, dev.buffer.ptr())?;
        let mut off = 0usize;
        for c in chunks {
            let bytes = &host[off..off + c.len as usize];
            if ObjectId::of(bytes) != c.id {
                bail!("{}: bytes at {off} in VRAM do not match chunk {}", entry.path, c.id.short());
            }
            off += c.len as usize;
        }
    }
    Ok(())
}
