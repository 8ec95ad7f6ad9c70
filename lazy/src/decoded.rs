//! Lazy memory decoded ahead. While a restore is made ready (the machine checked, the CUDA
//! driver started) the cores are idle; they decode the segments the fill will copy first, in
//! its order, into memory, each checked against its chunks' ids as the fill checks them. The
//! fill then copies those into the tasks without waiting on a decode ([`Decoded::take`]).

use crate::fetch::FileChunks;
use crate::fill::Image;
use crate::layout::Layout;
use crate::profile::Profile;
use crate::Result;
use gstore_store::IndexedStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// One segment's bytes, checked: `len` bytes from `at`.
pub(crate) struct Segment {
    buf: Vec<u8>,
    at: usize,
}

impl Segment {
    /// The segment's bytes (the rest of the buffer after them is slack).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// Segments decoded ahead, by (process in the layout, segment in its image).
#[derive(Default)]
pub struct Decoded {
    segments: Mutex<HashMap<(usize, usize), Segment>>,
    bytes: AtomicU64,
}

impl Decoded {
    /// Segment `seg` of process `image`, if it was decoded ahead (it is handed over once).
    pub(crate) fn take(&self, image: usize, seg: usize) -> Option<Segment> {
        self.segments.lock().expect("decoded lock").remove(&(image, seg))
    }

    /// Bytes decoded ahead.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
}

/// Decodes the lazy memory of `layout` (whose pages files' chunks are `chunks`) in the order
/// the fill takes it (`profile` first), from `workers` threads, until `until` is set or
/// `budget` bytes are held. A segment that fails to decode is left to the fill, which then
/// fails on it with its own error.
pub fn decode_ahead(
    store: &IndexedStore,
    layout: &Layout,
    chunks: &[FileChunks],
    profile: Option<&Profile>,
    until: &AtomicBool,
    budget: u64,
    workers: usize,
) -> Decoded {
    let images: Vec<Image> =
        layout.processes.iter().zip(chunks).map(|(p, c)| Image::new(p, c.clone(), profile)).collect();
    // Every process's first segments before any process's next ones.
    let mut order: Vec<(usize, usize, usize)> = images
        .iter()
        .enumerate()
        .flat_map(|(i, image)| image.order.iter().enumerate().map(move |(rank, &seg)| (rank, i, seg)))
        .collect();
    order.sort_unstable();
    let decoded = Decoded::default();
    let next = AtomicUsize::new(0);
    let chunk_max = store.config().chunk_max;
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| {
                let mut decoder = store.decoder();
                while !until.load(Ordering::Acquire) {
                    let Some(&(_, image, seg)) = order.get(next.fetch_add(1, Ordering::AcqRel)) else { return };
                    let range = images[image].segment_range(seg);
                    let len = range.end - range.start;
                    if decoded.bytes.fetch_add(len, Ordering::AcqRel) + len > budget {
                        decoded.bytes.fetch_sub(len, Ordering::AcqRel);
                        return;
                    }
                    let mut buf = vec![0u8; FileChunks::buffer_len(len, chunk_max)];
                    let read: Result<usize> = images[image].chunks.read_into(store, range, &mut buf, &mut decoder);
                    match read {
                        Ok(at) => {
                            buf.truncate(at + len as usize);
                            decoded.segments.lock().expect("decoded lock").insert((image, seg), Segment { buf, at });
                        }
                        Err(_) => {
                            decoded.bytes.fetch_sub(len, Ordering::AcqRel);
                        }
                    }
                }
            });
        }
    });
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Process, Run};
    use gstore_store::commands::push;
    use gstore_store::format::meta::ImageMeta;
    use gstore_store::progress::Silent;
    use gstore_store::{Store, StoreConfig, StoreLocation, TagRef};

    const MIB: u64 = 1 << 20;

    /// A store holding one image with a 6 MiB pages file of float-like words, the layout of a
    /// process whose memory is all of it, and the file's bytes.
    fn image(dir: &std::path::Path) -> (IndexedStore, Layout, Vec<FileChunks>, Vec<u8>) {
        let loc = StoreLocation::Local(dir.join("store"));
        Store::init(&loc, &StoreConfig::default()).unwrap();
        let store = Store::open_indexed(&loc, &|_| {}).unwrap();
        let bytes: Vec<u8> = (0..6 * MIB as u32 / 4)
            .flat_map(|i| ((i.wrapping_mul(2_654_435_761) >> 20) as f32 * 1e-4).to_le_bytes())
            .collect();
        let src = dir.join("img");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("pages-1.img"), &bytes).unwrap();
        let pushed = push::push(&store, &src, &TagRef::parse("p:1").unwrap(), ImageMeta::default(), &Silent).unwrap();
        let m = store.get_manifest(&pushed.manifest).unwrap();
        let run = Run { vaddr: 0x7f00_0000_0000, file_off: 0, len: 6 * MIB, area_len: 6 * MIB };
        let process = Process {
            pid: 1,
            pages_file: "pages-1.img".into(),
            lazy: vec![run],
            eager: Vec::new(),
            pages_len: 6 * MIB,
        };
        let chunks = vec![FileChunks::locate(&store, &m, "pages-1.img").unwrap()];
        (store, Layout { processes: vec![process], tasks: 1 }, chunks, bytes)
    }

    #[test]
    fn segments_are_decoded_ahead_within_the_budget_and_handed_over_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, layout, chunks, bytes) = image(tmp.path());
        let go_on = AtomicBool::new(false);
        let decoded = decode_ahead(&store, &layout, &chunks, None, &go_on, 4 * MIB, 2);
        assert_eq!(decoded.bytes(), 4 * MIB, "two segments of 2 MiB fit the budget, the third does not");
        let mut taken = 0;
        for seg in 0..3 {
            let Some(s) = decoded.take(0, seg) else { continue };
            let at = (seg as u64 * 2 * MIB) as usize;
            assert!(s.bytes()[..2 * MIB as usize] == bytes[at..at + 2 * MIB as usize], "segment {seg}");
            assert!(decoded.take(0, seg).is_none(), "handed over once");
            taken += 1;
        }
        assert_eq!(taken, 2);

        let stop = AtomicBool::new(true);
        assert_eq!(decode_ahead(&store, &layout, &chunks, None, &stop, 4 * MIB, 2).bytes(), 0, "told to stop");
    }
}
