//! Loads onto several devices at once, each fed by its own planner, staging and workers in
//! parallel: an image split across them (whole files, about the same bytes on each) or
//! replicated on every one.

use super::{restore_to_device_with, DeviceImage};
use crate::budget::Budget;
use gstore_gpu_dump::cuda::Context;
use gstore_store::format::manifest::Manifest;
use gstore_store::progress::{Progress, Unit};
use gstore_store::{IndexedStore, Result};

/// How an image is placed on several devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Each file goes to one device; the largest files are placed first, each on the device
    /// with the fewest bytes so far, so the devices load about the same amount in parallel.
    Split,
    /// Every device gets every file.
    Replicate,
}

/// The files of `m` that `spread` gives to each of `devices` devices, as manifests of their
/// own (entries in image order).
pub fn parts(m: &Manifest, devices: usize, spread: Spread) -> Vec<Manifest> {
    let devices = devices.max(1);
    if spread == Spread::Replicate {
        return vec![m.clone(); devices];
    }
    let mut by_size: Vec<usize> = (0..m.entries.len()).collect();
    by_size.sort_by_key(|&i| std::cmp::Reverse(m.entries[i].size));
    let mut load = vec![0u64; devices];
    let mut owner = vec![0usize; m.entries.len()];
    for i in by_size {
        let d = (0..devices).min_by_key(|&d| (load[d], d)).expect("at least one device");
        owner[i] = d;
        load[d] += m.entries[i].size;
    }
    (0..devices)
        .map(|d| {
            let mut part = Manifest {
                created_unix: m.created_unix,
                meta: m.meta.clone(),
                entries: Vec::new(),
                chunks: Vec::new(),
            };
            for (i, (e, chunks)) in m.files().enumerate() {
                if owner[i] == d {
                    part.entries.push(e.clone());
                    part.chunks.extend_from_slice(chunks);
                }
            }
            part
        })
        .collect()
}

/// Passes progress on, leaving the start and end of the phase to the caller.
struct Share<'a>(&'a dyn Progress);

impl Progress for Share<'_> {
    fn start(&self, _: &str, _: u64, _: Unit) {}
    fn advance(&self, n: u64) {
        self.0.advance(n)
    }
    fn finish(&self) {}
}

/// Restores `m` onto one device per entry of `open_contexts` (each a function giving that
/// device's context, called once its planner runs), placed as `spread` says, all devices at
/// once; `budget` is shared among them. Returns one image per device, in order; fails
/// if any device fails (every buffer is then freed).
pub fn restore_to_devices<F>(
    store: &IndexedStore,
    m: &Manifest,
    open_contexts: Vec<F>,
    spread: Spread,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<Vec<DeviceImage>>
where
    F: FnOnce() -> Result<Context> + Send,
{
    let parts = parts(m, open_contexts.len(), spread);
    let total = parts.iter().flat_map(|p| &p.chunks).filter(|c| !c.zero).map(|c| c.len as u64).sum();
    let budget = budget.share(parts.len());
    progress.start("loading", total, Unit::Bytes);
    let share = Share(progress);
    let loaded: Vec<Result<DeviceImage>> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .zip(open_contexts)
            .map(|(part, open)| s.spawn(|| restore_to_device_with(store, part, open, budget, &share)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("device loads do not panic")).collect()
    });
    progress.finish();
    loaded.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_store::format::manifest::{ChunkRef, Entry, EntryKind};
    use gstore_store::ObjectId;

    fn image(sizes: &[u64]) -> Manifest {
        let mut m = Manifest { created_unix: 1, meta: Default::default(), entries: Vec::new(), chunks: Vec::new() };
        for (i, &size) in sizes.iter().enumerate() {
            m.entries.push(Entry {
                path: format!("f{i}"),
                kind: EntryKind::File,
                mode: 0o644,
                size,
                target: None,
                chunks: 1,
            });
            m.chunks.push(ChunkRef { id: ObjectId::of(&[i as u8]), len: size as u32, zero: false });
        }
        m
    }

    #[test]
    fn a_split_balances_bytes_and_keeps_each_file_whole() {
        let m = image(&[50, 10, 40, 30, 20, 45]);
        let parts = parts(&m, 2, Spread::Split);
        let bytes: Vec<u64> = parts.iter().map(|p| p.logical_size()).collect();
        assert_eq!(bytes.iter().sum::<u64>(), 195);
        assert!(bytes[0].abs_diff(bytes[1]) <= 10, "{bytes:?}");
        let mut names: Vec<String> = parts.iter().flat_map(|p| p.entries.iter().map(|e| e.path.clone())).collect();
        names.sort();
        assert_eq!(names, ["f0", "f1", "f2", "f3", "f4", "f5"]);
        for p in &parts {
            assert_eq!(p.chunks.len(), p.entries.len());
            for ((e, c), _) in p.files().zip(0..) {
                assert_eq!(c[0].len as u64, e.size, "a file keeps its own chunks");
            }
        }
    }

    #[test]
    fn replication_gives_every_device_everything() {
        let m = image(&[5, 7]);
        let parts = parts(&m, 3, Spread::Replicate);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.entries.len() == 2 && p.logical_size() == 12));
    }

    #[test]
    fn more_devices_than_files_leaves_some_empty() {
        let parts = parts(&image(&[5]), 3, Spread::Split);
        assert_eq!(parts.iter().map(|p| p.entries.len()).collect::<Vec<_>>(), [1, 0, 0]);
    }
}
