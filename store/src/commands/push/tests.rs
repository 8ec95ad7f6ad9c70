//! Tests of the push pipeline.

use super::read::read_units;
use super::*;
use crate::backend::Backend;
use crate::repo::location::StoreLocation;
use std::os::fd::AsRawFd;

#[test]
fn a_manifest_id_with_a_tombstone_is_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::memory();
    let loc = StoreLocation::Custom { description: "memory".into(), dir: dir.path().to_path_buf() };
    Store::init_backend(&b, &loc, &crate::StoreConfig::default()).unwrap();
    let store = Store::open_backend(b.clone(), &loc).unwrap();
    let mut m = Manifest { created_unix: 100, meta: ImageMeta::default(), entries: Vec::new(), chunks: Vec::new() };
    let first = ObjectId::of(&m.encode());
    // gc tombstoned an identical manifest: the push must take another id.
    b.put(&ObjectKey::Manifest(first).tombstone(), b"{}".to_vec()).unwrap();
    let lease = Lease::take(&b, "push t").unwrap();
    let id = store_manifest(&store, &lease, &mut m).unwrap();
    assert_ne!(id, first);
    assert_eq!(store.get_manifest(&id).unwrap(), m);
    assert_eq!((m.created_unix, ObjectId::of(&m.encode())), (101, id));
    let rec: crate::format::lease::LeaseRecord =
        crate::format::lease::LeaseRecord::from_json(&b.get(lease.key()).unwrap(), &lease.key().to_string()).unwrap();
    assert!(rec.manifest_ids().any(|m| m == id), "the new id is leased");
}

proptest::proptest! {
    #[test]
    fn pieces_read_as_their_concatenation(
        parts in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..8),
        at in 0usize..400,
        len in 0usize..100,
    ) {
        let whole: Vec<u8> = parts.concat();
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let mut starts = Vec::new();
        let mut size = 0u64;
        for p in &slices {
            starts.push(size);
            size += p.len() as u64;
        }
        let content = Content::Pieces { parts: &slices, starts };
        let entry = SourceEntry::in_memory("f", size);
        let mut buf = vec![0u8; len];
        let r = content.read_exact_at(&mut buf, at as u64, &entry);
        if at + len <= whole.len() {
            proptest::prop_assert!(r.is_ok());
            proptest::prop_assert_eq!(&buf[..], &whole[at..at + len]);
        } else {
            proptest::prop_assert!(r.is_err());
        }
    }
}

#[test]
fn a_file_the_page_cache_lacks_is_read_ahead_into_the_same_image() {
    let dir = tempfile::tempdir().unwrap();
    // More than one batch of units (16 MiB segments, batches of at least 64 MiB).
    let data: Vec<u8> = (0..70u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let file = dir.path().join("pages-1.img");
    std::fs::write(&file, &data).unwrap();
    let silent = crate::progress::Silent;
    let pushed = |name: &str| {
        let loc = StoreLocation::Local(dir.path().join(name));
        Store::init(&loc, &crate::StoreConfig::default()).unwrap();
        let store = Store::open_indexed(&loc, &|_| {}).unwrap();
        let r = push(&store, &file, &TagRef::parse("m:x").unwrap(), ImageMeta::default(), &silent).unwrap();
        store.get_manifest(&r.manifest).unwrap().chunks
    };
    let from_cache = pushed("cached");
    // Out of the page cache, as after a reboot: every unit is read ahead.
    let f = std::fs::File::open(&file).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let entries = source::scan(&file).unwrap();
    let contents = open_files(&entries).unwrap();
    let reader = Reader { entries: &entries, contents: &contents };
    let units = plan_units(&entries, &crate::StoreConfig::default());
    assert!(units.len() > 4 && units.iter().all(|u| !reader.cached(u)), "the file left the page cache");
    assert_eq!(pushed("uncached"), from_cache, "read ahead, the file is cut into the same chunks");
    assert_eq!(from_cache.iter().map(|c| c.len as usize).sum::<usize>(), data.len());
}

#[test]
fn a_file_that_shrank_before_it_was_read_ahead_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pages-1.img");
    std::fs::write(&file, vec![7u8; 20 << 20]).unwrap();
    let entries = source::scan(&file).unwrap();
    let contents = open_files(&entries).unwrap();
    let mut units = plan_units(&entries, &crate::StoreConfig::default());
    std::fs::File::options().write(true).open(&file).unwrap().set_len(1 << 20).unwrap();
    let reader = Reader { entries: &entries, contents: &contents };
    let e = read_units(&mut units, &reader).unwrap_err();
    assert!(e.to_string().contains("pages-1.img shrank while it was being pushed"), "{e}");
}

#[test]
fn pieces_push_as_the_file_they_make_up() {
    let dir = tempfile::tempdir().unwrap();
    let loc = StoreLocation::Local(dir.path().join("store"));
    Store::init(&loc, &crate::StoreConfig::default()).unwrap();
    let store = Store::open_indexed(&loc, &|_| {}).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let file = dir.path().join("model.bin");
    std::fs::write(&file, &data).unwrap();
    let silent = crate::progress::Silent;
    let a = push(&store, &file, &TagRef::parse("m:file").unwrap(), ImageMeta::default(), &silent).unwrap();
    let pieces = vec![&data[..10], &data[10..10], &data[10..1_234_567], &data[1_234_567..]];
    let files = vec![("model.bin".to_string(), pieces)];
    let b = push_pieces(&store, &files, &TagRef::parse("m:pieces").unwrap(), ImageMeta::default(), &silent).unwrap();
    assert_eq!((b.new_chunks, b.logical_bytes, b.entries), (0, data.len() as u64, 1), "every chunk deduplicated");
    let chunks = |r: &PushReport| store.get_manifest(&r.manifest).unwrap().chunks;
    assert_eq!(chunks(&a), chunks(&b));
    let bad = vec![("../x".to_string(), vec![&data[..1]])];
    let e = push_pieces(&store, &bad, &TagRef::parse("m:bad").unwrap(), ImageMeta::default(), &silent).unwrap_err();
    assert!(e.to_string().contains("../x"), "{e}");
    let twice = vec![("a".to_string(), vec![&data[..1]]), ("a".to_string(), vec![&data[..1]])];
    let e = push_pieces(&store, &twice, &TagRef::parse("m:twice").unwrap(), ImageMeta::default(), &silent).unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
}
