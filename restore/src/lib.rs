//! gstore's restore engine: plans which pack ranges an image needs, fetches them in parallel,
//! verifies every chunk against its BLAKE3 id, decodes it and hands it to a sink: a directory
//! tree ([`restore_to_dir`], copying what a [`seed::Seed`] directory already holds), host memory ([`restore_to_memory`]) or device memory
//! ([`restore_to_device`], through pinned staging buffers on several CUDA streams).
//!
//! Memory stays under a budget whatever the image size: each worker thread holds one range
//! read and its decoded bytes ([`Budget::max_read`]).
//!
//! Filling buffers from a program:
//!
//! ```no_run
//! use gstore_store::{progress::Silent, Store, StoreLocation};
//!
//! let store = Store::open_indexed(&StoreLocation::parse("/var/lib/gstore")?, &|msg| eprintln!("{msg}"))?;
//! let id = store.resolve("llama:v1")?;
//! let manifest = store.get_manifest(&id)?;
//! let image = gstore_restore::restore_to_memory(&store, &manifest, gstore_restore::Budget::DEFAULT, &Silent)?;
//! let weights: &[u8] = image.get("model.safetensors").expect("in the image");
//! println!("{} bytes, first byte {}", weights.len(), weights[0]);
//! # Ok::<(), gstore_store::StoreError>(())
//! ```

pub mod budget;
pub mod cat;
pub mod device;
pub mod dir;
pub mod engine;
mod handles;
pub mod host;
pub mod plan;
pub mod seed;

pub use budget::Budget;
pub use device::{
    bind_hold_socket, load_held, restore_prepared, restore_to_device, restore_to_device_needing,
    restore_to_device_with, restore_to_devices, DeviceImage, Holder, PreparedDevice, Spread, Staging, TransferWaits,
};
pub use dir::{restore_to_dir, restore_to_dir_seeded, RestoreReport};
pub use host::{restore_to_memory, HostImage};
