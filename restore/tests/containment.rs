//! Property: whatever manifest decodes, restoring it into a directory writes nothing outside
//! that directory — also when a staging directory full of symlinks was planted beside it.

use gstore_restore::restore_to_dir;
use gstore_store::format::manifest::{ChunkRef, Entry, EntryKind, Manifest};
use gstore_store::progress::Silent;
use gstore_store::{ObjectId, Store, StoreConfig, StoreLocation, TagRef};
use proptest::prelude::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Path components the generated entries are made of.
const NAMES: [&str; 3] = ["a", "b", "victim.txt"];
/// Symlink targets: `@` stands for the outside directory's absolute path.
const TARGETS: [&str; 6] = ["@", "@/victim.txt", "@/sub", "..", "../..", "a"];

/// One generated entry: path components, kind (0 dir, 1 file, 2 symlink), target, file content
/// (0 empty, 1 a zero chunk, 2 a stored chunk), mode.
type Spec = (Vec<usize>, u8, usize, u8, u32);

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::collection::vec(0..NAMES.len(), 1..4),
        0..3u8,
        0..TARGETS.len(),
        0..3u8,
        prop::sample::select(vec![0o755, 0o644, 0o4755, 0o400]),
    )
}

/// Everything below `dir` (not following symlinks): path, mode, link target or file bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for item in fs::read_dir(&d).unwrap() {
            let p = item.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let data = if md.file_type().is_symlink() {
                fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes()
            } else if md.is_dir() {
                todo.push(p.clone());
                Vec::new()
            } else {
                fs::read(&p).unwrap()
            };
            out.push((p, md.mode(), data));
        }
    }
    out.sort();
    out
}

struct World {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    store: gstore_store::IndexedStore,
    stored: ChunkRef,
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().to_path_buf();
    let loc = StoreLocation::Local(base.join("store"));
    Store::init(&loc, &StoreConfig::default()).unwrap();
    let store = Store::open_indexed(&loc, &|_| {}).unwrap();
    let src = base.join("data.bin");
    fs::write(&src, b"stored chunk bytes ".repeat(300)).unwrap();
    let pushed =
        gstore_store::commands::push::push(&store, &src, &TagRef::parse("data").unwrap(), Default::default(), &Silent)
            .unwrap();
    let id = pushed.manifest;
    let stored = store.get_manifest(&id).unwrap().chunks[0];
    World { _tmp: tmp, base, store, stored }
}

fn manifest(w: &World, specs: &[Spec], outside: &Path) -> Manifest {
    let zero = ChunkRef { id: ObjectId::of(&[0u8; 4096]), len: 4096, zero: true };
    let mut m = Manifest { created_unix: 1, meta: Default::default(), entries: vec![], chunks: vec![] };
    for (parts, kind, target, content, mode) in specs {
        let path = parts.iter().map(|&i| NAMES[i]).collect::<Vec<_>>().join("/");
        if m.entries.iter().any(|e| e.path == path) {
            continue;
        }
        let mut e = Entry { path, kind: EntryKind::Dir, mode: *mode, size: 0, target: None, chunks: 0 };
        match kind {
            0 => {}
            1 => {
                e.kind = EntryKind::File;
                let chunk = [None, Some(zero), Some(w.stored)][*content as usize];
                if let Some(c) = chunk {
                    e.size = c.len as u64;
                    e.chunks = 1;
                    m.chunks.push(c);
                }
            }
            _ => {
                e.kind = EntryKind::Symlink;
                e.target = Some(TARGETS[*target].replace('@', outside.to_str().unwrap()));
            }
        }
        m.entries.push(e);
    }
    m
}

/// Fills a staging directory as another user (or a careless script) might have left it,
/// never itself writing through a symlink it planted.
fn plant(staging: &Path, id: &ObjectId, specs: &[Spec], outside: &Path) {
    fs::create_dir(staging).unwrap();
    fs::set_permissions(staging, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(staging.join(".gstore-restore"), id.to_hex()).unwrap();
    'entries: for (parts, kind, target, _, _) in specs {
        let mut path = staging.to_path_buf();
        for &i in &parts[..parts.len() - 1] {
            path.push(NAMES[i]);
            match fs::symlink_metadata(&path) {
                Ok(md) if md.file_type().is_dir() => {}
                Ok(_) => continue 'entries,
                Err(_) => fs::create_dir(&path).unwrap(),
            }
        }
        path.push(NAMES[parts[parts.len() - 1]]);
        let _ = match kind {
            0 => fs::create_dir(&path),
            1 => fs::OpenOptions::new().write(true).create_new(true).open(&path).map(drop),
            _ => std::os::unix::fs::symlink(TARGETS[*target].replace('@', outside.to_str().unwrap()), &path),
        };
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_write_lands_outside_the_destination(
        specs in prop::collection::vec(spec(), 1..8),
        planted in prop::option::of(prop::collection::vec(spec(), 1..6)),
    ) {
        thread_local!(static WORLD: World = world());
        WORLD.with(|w| {
            let case = tempfile::tempdir_in(&w.base).unwrap();
            let (parent, outside) = (case.path().join("parent"), case.path().join("outside"));
            fs::create_dir_all(outside.join("sub")).unwrap();
            fs::write(outside.join("victim.txt"), b"precious").unwrap();
            fs::create_dir(&parent).unwrap();
            let before = snapshot(&outside);

            let m = manifest(w, &specs, &outside);
            let bytes = m.encode();
            let id = ObjectId::of(&bytes);
            let Ok(m) = Manifest::decode(&bytes, &id) else { return Ok(()) };
            if let Some(p) = &planted {
                plant(&parent.join(".dest.gstore-partial"), &id, p, &outside);
            }
            let dest = parent.join("dest");
            let restored = restore_to_dir(&w.store, &id, &m, &dest, gstore_restore::Budget::of(1 << 24), &Silent);

            prop_assert_eq!(snapshot(&outside), before, "the outside directory changed");
            let left: Vec<_> = fs::read_dir(&parent).unwrap().map(|e| e.unwrap().file_name()).collect();
            prop_assert!(left.iter().all(|n| n == "dest"), "left beside the destination: {:?}", left);
            if restored.is_ok() {
                for e in &m.entries {
                    let md = fs::symlink_metadata(dest.join(&e.path)).unwrap();
                    let kind = md.file_type();
                    prop_assert!(match e.kind {
                        EntryKind::Dir => kind.is_dir(),
                        EntryKind::File => kind.is_file() && md.len() == e.size,
                        EntryKind::Symlink => kind.is_symlink(),
                    }, "{} restored as {:?}", e.path, kind);
                }
            }
            Ok(())
        })?;
    }
}
