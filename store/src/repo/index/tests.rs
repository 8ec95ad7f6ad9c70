//! The index's tests: lookups, recorded plans, read-only opens, layouts.
use super::*;

#[test]
fn add_locate_remove_clear() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(&dir.path().join("idx")).unwrap();
    assert!(idx.needs_fill());
    let pack = ObjectId::of(b"pack");
    let e =
        PackEntry { id: ObjectId::of(b"c"), offset: 8, stored_len: 5, plain_len: 9, codec: Codec::Zstd, bases: None };
    idx.add_pack(pack, 100, &[e]).unwrap();
    let loc = idx.locate(&e.id).unwrap().unwrap();
    assert_eq!((loc.pack, loc.offset, loc.stored_len, loc.plain_len, loc.codec), (pack, 8, 5, 9, Codec::Zstd));
    // A second pack with the same chunk is a second holder.
    let other = ObjectId::of(b"other");
    idx.add_pack(other, 50, &[PackEntry { offset: 99, ..e }]).unwrap();
    assert_eq!(idx.holders(&e.id).unwrap().len(), 2);
    assert_eq!(idx.packs().unwrap().len(), 2);
    assert_eq!(idx.pack_stats(&pack).unwrap().unwrap().plain_bytes, 9);
    // A doomed holder is used only when it is the last one, and never for dedup.
    idx.set_doomed(&[pack].into()).unwrap();
    assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, other);
    idx.remove_pack(&other).unwrap();
    assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, pack);
    assert!(idx.locate_for_dedup(&e.id).unwrap().is_none());
    drop(idx);
    // The doomed set and the format survive a reopen.
    let idx = Index::open(&dir.path().join("idx")).unwrap();
    assert!(!idx.needs_fill());
    assert!(idx.locate_for_dedup(&e.id).unwrap().is_none());
    idx.clear().unwrap();
    assert!(idx.locate(&e.id).unwrap().is_none());
    assert!(idx.packs().unwrap().is_empty());
}

#[test]
fn a_recorded_plan_comes_back_while_its_packs_are_there() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(&dir.path().join("idx")).unwrap();
    let (p1, p2) = (ObjectId::of(b"p1"), ObjectId::of(b"p2"));
    let entry = |name: &[u8], offset, codec, bases| PackEntry {
        id: ObjectId::of(name),
        offset,
        stored_len: 10,
        plain_len: 20,
        codec,
        bases,
    };
    let delta = entry(b"d", 30, Codec::Delta, Some(DeltaBases { first: ObjectId::of(b"a"), second: None }));
    idx.add_pack(p1, 100, &[entry(b"a", 24, Codec::Raw, None), delta]).unwrap();
    idx.add_pack(p2, 100, &[entry(b"b", 24, Codec::Zstd, None)]).unwrap();
    let locations: Vec<ChunkLocation> =
        [b"b".as_slice(), b"a", b"d", b"b"].iter().map(|n| idx.locate(&ObjectId::of(n)).unwrap().unwrap()).collect();
    let located: Vec<Option<ChunkLocation>> = locations.iter().cloned().map(Some).collect();
    let key = ObjectId::of(b"image");
    assert!(idx.plan(&key).unwrap().is_none());
    let record_plan = || {
        let mut record = PlanRecord::default();
        locations.iter().for_each(|l| record.push(l));
        idx.put_plan(&key, record).unwrap();
    };
    record_plan();
    assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
    // Caught up with the backend, the index's packs are those it listed.
    idx.set_caught_up(&[p1, p2].into()).unwrap();
    assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
    idx.set_caught_up(&[p1].into()).unwrap();
    assert!(idx.plan(&key).unwrap().is_none(), "a plan naming a pack not listed was used");
    idx.set_caught_up(&[p1, p2].into()).unwrap();
    // A tombstoned pack: not used (its chunks may have moved).
    idx.set_doomed(&[p2].into()).unwrap();
    assert!(idx.plan(&key).unwrap().is_none());
    idx.set_doomed(&HashSet::new()).unwrap();
    assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
    // A plan recorded once a copy in it was known damaged (by the restore that failed on
    // it) is not used once a push stored a good copy: it names the pack holding the bad one.
    idx.set_damaged(&[(ObjectId::of(b"b"), p2)].into()).unwrap();
    record_plan();
    assert!(idx.plan(&key).unwrap().is_none(), "a plan naming a damaged copy was used");
    idx.set_damaged(&HashSet::new()).unwrap();
    record_plan();
    assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
    // A record whose framing is damaged counts as none; a location whose value does not
    // decode comes back as none, the others as they were.
    let file = dir.path().join("idx.plans").join(key.to_hex());
    std::fs::write(&file, [1u8, 0, 0]).unwrap();
    assert!(idx.plan(&key).unwrap().is_none());
    record_plan();
    let mut value = std::fs::read(&file).unwrap();
    std::fs::write(&file, &value[..value.len() - 1]).unwrap();
    assert!(idx.plan(&key).unwrap().is_none(), "a record cut short was used");
    // The first location's codec byte (behind the pack list, the count, its pack number,
    // its length and 16 bytes of offset and lengths).
    let codec_at = 4 + 32 * 2 + 4 + 5 + 16;
    value[codec_at] = 0xee;
    std::fs::write(&file, &value).unwrap();
    let mut damaged_first = located.clone();
    damaged_first[0] = None;
    assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), damaged_first);
    record_plan();
    // A pack gc removed takes every record with it.
    idx.remove_pack(&p2).unwrap();
    assert!(idx.plan(&key).unwrap().is_none());
    assert!(!file.exists());
}

#[test]
fn a_read_only_index_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    assert!(Index::open_read_only(&path).unwrap().is_none(), "no index there yet");
    let pack = ObjectId::of(b"pack");
    let e =
        PackEntry { id: ObjectId::of(b"c"), offset: 8, stored_len: 5, plain_len: 9, codec: Codec::Zstd, bases: None };
    let idx = Index::open(&path).unwrap();
    idx.add_pack(pack, 100, &[e]).unwrap();
    idx.set_doomed(&[ObjectId::of(b"doomed")].into()).unwrap();
    idx.set_caught_up(&[pack].into()).unwrap();
    drop(idx);
    let idx = Index::open_read_only(&path).unwrap().expect("an index in this layout");
    assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, pack);
    assert!(idx.current_with(&[pack].into(), &[ObjectId::of(b"doomed")].into(), &HashSet::new()).unwrap());
    assert!(!idx
        .current_with(&[pack, ObjectId::of(b"new")].into(), &[ObjectId::of(b"doomed")].into(), &HashSet::new())
        .unwrap());
    assert!(!idx.current_with(&[pack].into(), &HashSet::new(), &HashSet::new()).unwrap());
    assert!(!idx.current_with(&[pack].into(), &[ObjectId::of(b"doomed")].into(), &[(e.id, pack)].into()).unwrap());
    assert!(!idx.current_with(&HashSet::new(), &[ObjectId::of(b"doomed")].into(), &HashSet::new()).unwrap());
    // Plans are files: recorded through a read-only index too.
    let mut record = PlanRecord::default();
    record.push(&idx.locate(&e.id).unwrap().unwrap());
    idx.put_plan(&ObjectId::of(b"image"), record).unwrap();
    assert_eq!(idx.plan(&ObjectId::of(b"image")).unwrap().unwrap().count(), 1);
    let refused = idx.add_pack(ObjectId::of(b"other"), 1, &[e]).unwrap_err();
    assert!(refused.to_string().contains("read-only"), "{refused}");
    assert!(idx.remove_pack(&pack).is_err() && idx.set_doomed(&HashSet::new()).is_err());
    drop(idx);
    // Nothing was written: the pack is still the only one.
    let idx = Index::open(&path).unwrap();
    assert_eq!(idx.packs().unwrap().len(), 1);
    // A pack added or removed since the index was caught up: no longer current.
    idx.add_pack(ObjectId::of(b"other"), 1, &[e]).unwrap();
    idx.remove_pack(&ObjectId::of(b"other")).unwrap();
    assert!(!idx.current_with(&[pack].into(), &[ObjectId::of(b"doomed")].into(), &HashSet::new()).unwrap());
    idx.set_caught_up(&[pack].into()).unwrap();
    assert!(idx.current_with(&[pack].into(), &[ObjectId::of(b"doomed")].into(), &HashSet::new()).unwrap());
}

#[test]
fn layout_3s_plans_go_at_a_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    drop(Index::open(&path).unwrap());
    {
        let mut opts = Options::default();
        opts.create_missing_column_families(true);
        let db = DB::open_cf(&opts, &path, FAMILIES.iter().chain([&CF_OLD_PLANS])).unwrap();
        db.put_cf(db.cf_handle(CF_OLD_PLANS).unwrap(), b"key", b"value").unwrap();
    }
    assert!(Index::open_read_only(&path).unwrap().is_some(), "read-only, the old family is left alone");
    drop(Index::open(&path).unwrap());
    let families = DB::list_cf(&Options::default(), &path).unwrap();
    assert!(!families.iter().any(|f| f == CF_OLD_PLANS), "{families:?}");
}

#[test]
fn a_delta_whose_bases_are_gone_is_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(dir.path()).unwrap();
    // Pack ids ordered so that the orphan's pack comes first among the holders.
    let (orphan_pack, whole_pack, base_pack) = (ObjectId([1; 32]), ObjectId([2; 32]), ObjectId([3; 32]));
    let (chunk, base) = (ObjectId::of(b"chunk"), ObjectId::of(b"base"));
    let entry = |id, codec, bases| PackEntry { id, offset: 24, stored_len: 10, plain_len: 20, codec, bases };
    let delta = entry(chunk, Codec::Delta, Some(DeltaBases::one(base)));
    idx.add_pack(orphan_pack, 100, &[delta]).unwrap();
    // Its base is stored nowhere: the chunk has no usable copy.
    assert!(idx.locate(&chunk).unwrap().is_none());
    assert!(idx.locate_for_dedup(&chunk).unwrap().is_none());
    assert_eq!(idx.locate_many(&[chunk]).unwrap(), vec![None]);
    // A whole copy elsewhere is the one used.
    idx.add_pack(whole_pack, 100, &[entry(chunk, Codec::Zstd, None)]).unwrap();
    for found in [idx.locate(&chunk), idx.locate_for_dedup(&chunk), idx.locate_many(&[chunk]).map(|v| v[0])] {
        assert_eq!(found.unwrap().unwrap().pack, whole_pack);
    }
    // With its base stored whole, the delta (first in key order) is a copy again...
    idx.add_pack(base_pack, 100, &[entry(base, Codec::Raw, None)]).unwrap();
    assert_eq!(idx.locate_for_dedup(&chunk).unwrap().unwrap().pack, orphan_pack);
    // ...but not for dedup while its base's only pack is tombstoned, nor when that base
    // is itself only a delta.
    idx.set_doomed(&[base_pack].into()).unwrap();
    assert_eq!(idx.locate_for_dedup(&chunk).unwrap().unwrap().pack, whole_pack);
    assert_eq!(idx.locate(&chunk).unwrap().unwrap().pack, orphan_pack);
    idx.remove_pack(&whole_pack).unwrap();
    assert!(idx.locate_for_dedup(&chunk).unwrap().is_none());
    idx.remove_pack(&base_pack).unwrap();
    let other = ObjectId::of(b"other");
    idx.add_pack(base_pack, 100, &[entry(base, Codec::Delta, Some(DeltaBases::one(other)))]).unwrap();
    assert!(idx.locate(&chunk).unwrap().is_none());
}

#[test]
fn a_damaged_copy_is_used_last_and_never_for_dedup() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(dir.path()).unwrap();
    let (p1, p2) = (ObjectId([1; 32]), ObjectId([2; 32]));
    let c = ObjectId::of(b"c");
    let e = PackEntry { id: c, offset: 24, stored_len: 10, plain_len: 20, codec: Codec::Zstd, bases: None };
    idx.add_pack(p1, 100, &[e]).unwrap();
    idx.set_damaged(&[(c, p1)].into()).unwrap();
    // Its only copy: read (a clear error then), never deduplicated against.
    assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p1);
    assert!(idx.locate_for_dedup(&c).unwrap().is_none());
    // Another copy, even in a tombstoned pack, comes first.
    idx.add_pack(p2, 100, &[e]).unwrap();
    idx.set_doomed(&[p2].into()).unwrap();
    assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p2);
    assert_eq!(idx.locate_many(&[c]).unwrap()[0].unwrap().pack, p2);
    drop(idx);
    // The set survives a reopen.
    let idx = Index::open(dir.path()).unwrap();
    assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p2);
    idx.set_damaged(&HashSet::new()).unwrap();
    assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p1);
}

#[test]
fn many_lookups_answer_as_single_ones_in_the_order_asked() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(dir.path()).unwrap();
    let (a, b) = (ObjectId::of(b"pack a"), ObjectId::of(b"pack b"));
    let entry = |n: u32| PackEntry {
        id: ObjectId::of(&n.to_le_bytes()),
        offset: u64::from(n) * 10,
        stored_len: 10,
        plain_len: 10,
        codec: Codec::Raw,
        bases: None,
    };
    idx.add_pack(a, 1000, &(0..50).map(entry).collect::<Vec<_>>()).unwrap();
    // Chunks 40..60 are in both packs; pack a is doomed, so b holds them for lookups.
    idx.add_pack(b, 1000, &(40..60).map(entry).collect::<Vec<_>>()).unwrap();
    idx.set_doomed(&[a].into()).unwrap();
    let ids: Vec<ObjectId> = (0..70u32).rev().map(|n| ObjectId::of(&n.to_le_bytes())).collect();
    let many = idx.locate_many(&ids).unwrap();
    let single: Vec<_> = ids.iter().map(|id| idx.locate(id).unwrap()).collect();
    assert_eq!(
        many.iter().map(|l| l.map(|l| (l.pack, l.offset))).collect::<Vec<_>>(),
        single.iter().map(|l| l.map(|l| (l.pack, l.offset))).collect::<Vec<_>>()
    );
    assert_eq!(many.iter().filter(|l| l.is_none()).count(), 10, "60..70 are unknown");
    assert_eq!(many[70 - 1 - 45].unwrap().pack, b, "a chunk in both packs comes from the live one");
    assert_eq!(many[70 - 1 - 5].unwrap().pack, a, "a chunk only a doomed pack holds comes from it");
}

#[test]
fn a_handle_that_only_added_packs_leaves_the_index_current_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    let (p1, p2, p3) = (ObjectId::of(b"p1"), ObjectId::of(b"p2"), ObjectId::of(b"p3"));
    let entry = |name: &[u8]| PackEntry {
        id: ObjectId::of(name),
        offset: 0,
        stored_len: 5,
        plain_len: 5,
        codec: Codec::Raw,
        bases: None,
    };
    let idx = Index::open(&path).unwrap();
    idx.add_pack(p1, 10, &[entry(b"a")]).unwrap();
    idx.set_caught_up(&[p1].into()).unwrap();
    drop(idx);
    // A push: the record is gone while its handle is open (a process stopped there leaves
    // none), and comes back with the pushed pack when the handle closes.
    let idx = Index::open(&path).unwrap();
    idx.add_pack(p2, 10, &[entry(b"b")]).unwrap();
    assert!(!idx.current_with(&[p1].into(), &HashSet::new(), &HashSet::new()).unwrap());
    assert!(
        !idx.current_with(&[p1, p2].into(), &HashSet::new(), &HashSet::new()).unwrap(),
        "a record while the handle adds"
    );
    drop(idx);
    let idx = Index::open_read_only(&path).unwrap().unwrap();
    assert!(idx.current_with(&[p1, p2].into(), &HashSet::new(), &HashSet::new()).unwrap());
    assert!(
        !idx.current_with(&[p1, p2, p3].into(), &HashSet::new(), &HashSet::new()).unwrap(),
        "another's pack went unnoticed"
    );
    assert!(!idx.current_with(&[p1].into(), &HashSet::new(), &HashSet::new()).unwrap());
    drop(idx);
    // A handle that also removed a pack leaves no record: the next open catches up.
    let idx = Index::open(&path).unwrap();
    idx.add_pack(p3, 10, &[entry(b"c")]).unwrap();
    idx.remove_pack(&p1).unwrap();
    drop(idx);
    let idx = Index::open_read_only(&path).unwrap().unwrap();
    assert!(!idx.current_with(&[p2, p3].into(), &HashSet::new(), &HashSet::new()).unwrap());
    drop(idx);
    // Nor does one that cleared the index and added packs again.
    let idx = Index::open(&path).unwrap();
    idx.set_caught_up(&[p2, p3].into()).unwrap();
    idx.clear().unwrap();
    idx.add_pack(p2, 10, &[entry(b"b")]).unwrap();
    drop(idx);
    let idx = Index::open_read_only(&path).unwrap().unwrap();
    assert!(!idx.current_with(&[p2, p3].into(), &HashSet::new(), &HashSet::new()).unwrap());
    assert!(!idx.current_with(&[p2].into(), &HashSet::new(), &HashSet::new()).unwrap());
}
