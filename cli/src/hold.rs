//! `gstore hold`: keep images in pinned host memory and load them into other processes' GPU
//! memory on request (gstore_restore::Holder); `gstore load --held` asks it.

use anyhow::{Context, Result};
use gstore_gpu_dump::CudaDriver;
use gstore_progress::Bars;
use gstore_restore::Holder;
use gstore_store::{Store, StoreLocation};
use indicatif::HumanBytes;
use std::path::Path;

/// Removes the socket file when the holder stops (by an error, or when serving ends).
struct SocketFile<'a>(&'a Path);

impl Drop for SocketFile<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Holds `images` of the store at `location` for loads into GPU `device` arriving at
/// `socket`, until the process is stopped. Reports on stderr.
pub fn hold(
    location: &StoreLocation,
    images: &[String],
    socket: &Path,
    device: &str,
    memory_budget: u64,
    bars: &Bars,
) -> Result<()> {
    let ordinal = crate::load::single_device(device)?;
    let started = std::thread::spawn(move || CudaDriver::load()?.context(ordinal));
    let listener = gstore_restore::bind_hold_socket(socket)?;
    let _socket = SocketFile(socket);
    let store = Store::open_indexed(location, &|msg| eprintln!("gstore: {msg}"))?;
    let mut list = Vec::with_capacity(images.len());
    for reference in images {
        let id = store.resolve(reference)?;
        list.push((reference.clone(), id, store.get_manifest(&id)?));
    }
    let ctx = started.join().expect("CUDA start does not panic").context("starting CUDA")?;
    let mut holder = Holder::new(&ctx, gstore_restore::Budget::of(memory_budget), store.config().chunk_max as usize)?;
    holder.hold(&store, list, bars)?;
    // Loads need no index: other gstore commands may lock it meanwhile.
    drop(store);
    let store = Store::open(location)?;
    eprintln!(
        "gstore: holding {} ({} of files, {} pinned{}) for loads into {device} at {}; {}",
        images.join(", "),
        HumanBytes(holder.image_bytes()),
        HumanBytes(holder.pinned_bytes()),
        match holder.base_bytes() {
            0 => String::new(),
            n => format!(", {} of delta bases", HumanBytes(n)),
        },
        socket.display(),
        holder.describe()
    );
    holder.serve(&store, &listener, &|line| eprintln!("gstore: {line}"))?;
    Ok(())
}
