//! An image made of other images' entries (`Store::compose`'s work): the new manifest lists
//! their chunk references, so no byte is read or stored again. A training job's ranks each
//! push their own part, and one of them composes the step's image from the parts and tags it
//! once every part is stored: the tag appears all at once or not at all.

use crate::commands::push::store_manifest;
use crate::error::{Result, StoreError};
use crate::format::manifest::{Entry, EntryKind, Manifest};
use crate::format::meta::ImageMeta;
use crate::format::tag::{TagRecord, TagRef};
use crate::repo::leases::Lease;
use crate::{IndexedStore, ObjectId};
use std::collections::BTreeMap;

/// Tags `tag` with one image holding every entry of images `parts` (in path order) and
/// metadata `meta`. A file path in two parts is refused (a directory may repeat). The parts
/// are held by a lease while the image is made, and refused if gc has begun to remove them.
/// Needs the index.
pub fn compose(store: &IndexedStore, tag: &TagRef, parts: &[ObjectId], meta: ImageMeta) -> Result<TagRecord> {
    tag.check_new()?;
    let lease = Lease::take(store.backend(), &format!("compose {tag}"))?;
    let manifests = store.hold_images(&lease, parts)?;
    let mut by_path: BTreeMap<&str, (&Entry, &[crate::format::manifest::ChunkRef])> = BTreeMap::new();
    for (m, id) in manifests.iter().zip(parts) {
        for (e, chunks) in m.files() {
            match by_path.get(e.path.as_str()) {
                Some((seen, _)) if seen.kind == EntryKind::Dir && e.kind == EntryKind::Dir => {}
                Some(_) => {
                    return Err(StoreError::Entry {
                        entry: e.path.clone(),
                        why: format!("in more than one of the images composed (image {} among them)", id.to_hex()),
                    })
                }
                None => {
                    by_path.insert(&e.path, (e, chunks));
                }
            }
        }
    }
    let mut manifest = Manifest {
        created_unix: crate::format::now_unix(),
        meta,
        entries: by_path.values().map(|(e, _)| (*e).clone()).collect(),
        chunks: by_path.values().flat_map(|(_, c)| c.iter().copied()).collect(),
    };
    let id = store_manifest(store, &lease, &mut manifest)?;
    let rec = store.set_tag(tag, id)?;
    drop(lease);
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::push::stream::push_fed;
    use crate::format::meta::Kind;
    use crate::progress::Silent;
    use crate::repo::location::StoreLocation;
    use crate::Store;

    /// Pushes `files` as image `tag`; returns its manifest id.
    fn push(store: &IndexedStore, tag: &str, files: &[(&str, &[u8])]) -> ObjectId {
        let tag = TagRef::parse(tag).unwrap();
        let (r, ()) = push_fed(store, &tag, 8 << 20, &Silent, |sink| -> Result<()> {
            sink.dir("shared", 0o755)?;
            for (path, bytes) in files {
                sink.file(path, 0o644)?.read_from(&mut &bytes[..])?;
            }
            sink.finish(ImageMeta::default())
        })
        .unwrap();
        r.manifest
    }

    #[test]
    fn parts_pushed_side_by_side_become_one_image() {
        let tmp = tempfile::tempdir().unwrap();
        let loc = StoreLocation::Local(tmp.path().join("store"));
        Store::init(&loc, &crate::StoreConfig::default()).unwrap();
        // Two ranks' stores on one machine hold their own index slots at the same time.
        let never = |msg: &str| panic!("a slot waited: {msg}");
        let rank0 = Store::open(&loc).unwrap().with_index_slot(0).with_index(&never).unwrap();
        let rank1 = Store::open(&loc).unwrap().with_index_slot(1).with_index(&never).unwrap();
        let a: Vec<u8> = (0..300_000u32).map(|i| (i * 7 / 3) as u8).collect();
        let b: Vec<u8> = (0..200_000u32).map(|i| (i * 5 / 9) as u8).collect();
        let p0 = push(&rank0, "run.part-0:step-1", &[("shared/rank-0", &a)]);
        let p1 = push(&rank1, "run.part-1:step-1", &[("shared/rank-1", &b)]);
        let tag = TagRef::parse("run:step-1").unwrap();
        let meta = ImageMeta::of_kind(Kind::Other("test".into()));
        let rec = compose(&rank0, &tag, &[p1, p0], meta).unwrap();
        let m = rank0.get_manifest(&rec.manifest_id().unwrap()).unwrap();
        let paths: Vec<&str> = m.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["shared", "shared/rank-0", "shared/rank-1"]);
        assert_eq!(m.logical_size(), (a.len() + b.len()) as u64);
        assert_eq!(m.meta.kind, Some(Kind::Other("test".into())));
        let (_, c0) = m.files().find(|(e, _)| e.path == "shared/rank-0").unwrap();
        let (_, c0_part) = rank0
            .get_manifest(&p0)
            .unwrap()
            .files()
            .find(|(e, _)| e.path == "shared/rank-0")
            .map(|(e, c)| (e.clone(), c.to_vec()))
            .unwrap();
        assert_eq!(c0, &c0_part[..], "the same chunks, nothing stored again");
        // A file in two parts is refused, and nothing is tagged.
        let again = push(&rank1, "run.part-2:step-1", &[("shared/rank-0", &b)]);
        let clash = TagRef::parse("run:step-2").unwrap();
        let err = compose(&rank0, &clash, &[p0, again], ImageMeta::default()).unwrap_err();
        assert!(err.to_string().contains("shared/rank-0: in more than one"), "{err}");
        assert!(rank0.get_tag(&clash).unwrap().is_none());
    }
}
