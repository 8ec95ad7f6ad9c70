//! Deterministic simulation of gc against concurrent pushes, tag removals and tag copies.
//!
//! Every actor — two pushing machines, one that removes and copies tags, one running gc
//! passes — works on its own `Store` over one shared in-memory backend, each machine with its
//! own RocksDB index. Every request passes a gate (an `object_store` wrapper around the
//! shared in-memory store, as object_store's own limit and throttle wrappers are); a seeded
//! scheduler lets exactly one actor run from one request to its next, so each seed is one interleaving of the real code at
//! request granularity. After every seed: every image a tag names (current value and history)
//! restores byte-exact from a fresh machine, `verify --read-data` is clean, one quiet gc
//! run leaves tombstoned only the packs it deferred (copies of live chunks), and a second one
//! leaves no pack without live data, no unreferenced manifest and no tombstone. The gc actor's runs are one-run gcs too: each may delete what its own first
//! pass tombstoned, while the pushes go on.

use futures::stream::{BoxStream, StreamExt};
use gstore_store::backend::Backend;
use gstore_store::commands::gc::{self, retention::Policy, GcOptions};
use gstore_store::format::key::{Family, ObjectKey};
use gstore_store::progress::Silent;
use gstore_store::{commands::verify, ObjectId, Store, StoreConfig, StoreError, StoreLocation, TagRef};
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex};

/// Seeds per test function; the four functions together run 1000 seeds.
const SEEDS_PER_TEST: u64 = 250;

#[derive(Default)]
struct Turns {
    /// Actors that have not finished.
    running: BTreeSet<usize>,
    /// Actors blocked at a gate.
    waiting: BTreeSet<usize>,
    /// The actor allowed to pass its gate next.
    granted: Option<usize>,
    /// Requests in the order they were let through: (actor, operation, key).
    trace: Vec<(usize, &'static str, String)>,
}

/// The seeded scheduler: one actor at a time runs from one request to the next.
#[derive(Default)]
struct Scheduler {
    turns: Mutex<Turns>,
    changed: Condvar,
}

impl Scheduler {
    /// Called by an actor's backend before each request: waits for this actor's turn.
    fn gate(&self, actor: usize, op: &'static str, key: &str) {
        let mut t = self.turns.lock().unwrap();
        t.waiting.insert(actor);
        self.changed.notify_all();
        while t.granted != Some(actor) {
            t = self.changed.wait(t).unwrap();
        }
        t.granted = None;
        t.waiting.remove(&actor);
        t.trace.push((actor, op, key.to_string()));
        self.changed.notify_all();
    }

    fn finish(&self, actor: usize) {
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        t.running.remove(&actor);
        self.changed.notify_all();
    }

    /// Runs until every actor has finished, granting turns with `rng`.
    fn drive(&self, rng: &mut StdRng) {
        let mut t = self.turns.lock().unwrap();
        loop {
            while t.granted.is_some() || t.running.iter().any(|a| !t.waiting.contains(a)) {
                t = self.changed.wait(t).unwrap();
            }
            if t.running.is_empty() {
                return;
            }
            let ready: Vec<usize> = t.waiting.iter().copied().collect();
            t.granted = Some(ready[rng.random_range(0..ready.len())]);
            self.changed.notify_all();
        }
    }
}

/// Marks an actor finished when it returns or panics, so the scheduler never waits for a
/// dead actor (the panic then fails the test).
struct Finish<'a>(&'a Scheduler, usize);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.finish(self.1);
    }
}

/// Small chunks and packs, so that a few KiB make many packs and shared chunks.
fn config() -> StoreConfig {
    StoreConfig {
        chunk_min: 256,
        chunk_avg: 1024,
        chunk_max: 4096,
        segment_size: 16384,
        pack_target: 6144,
        ..StoreConfig::default()
    }
}

/// What the pushes produced: the bytes of every image pushed, by manifest id.
type Pushed = Arc<Mutex<HashMap<ObjectId, Vec<u8>>>>;

/// An object store whose every request first waits at its actor's gate.
struct Gated {
    inner: Arc<InMemory>,
    actor: usize,
    sched: Arc<Scheduler>,
}

impl std::fmt::Debug for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gated {{ actor: {} }}", self.actor)
    }
}

impl std::fmt::Display for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gated({}, actor {})", self.inner, self.actor)
    }
}

impl Gated {
    fn pass(&self, op: &'static str, key: &str) {
        self.sched.gate(self.actor, op, key);
    }
}

#[async_trait::async_trait]
impl ObjectStore for Gated {
    async fn put_opts(&self, at: &ObjPath, payload: PutPayload, opts: PutOptions) -> object_store::Result<PutResult> {
        self.pass("put", at.as_ref());
        self.inner.put_opts(at, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        at: &ObjPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.pass("put_multipart", at.as_ref());
        self.inner.put_multipart_opts(at, opts).await
    }

    async fn get_opts(&self, at: &ObjPath, options: GetOptions) -> object_store::Result<GetResult> {
        self.pass("get", at.as_ref());
        self.inner.get_opts(at, options).await
    }

    fn delete_stream(
        &self,
        paths: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        let (actor, sched) = (self.actor, self.sched.clone());
        let gated = paths.map(move |p| {
            if let Ok(p) = &p {
                sched.gate(actor, "delete", p.as_ref());
            }
            p
        });
        self.inner.delete_stream(gated.boxed())
    }

    fn list(&self, prefix: Option<&ObjPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.pass("list", prefix.map_or("", |p| p.as_ref()));
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&ObjPath>) -> object_store::Result<ListResult> {
        self.pass("list_with_delimiter", prefix.map_or("", |p| p.as_ref()));
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &ObjPath, to: &ObjPath, options: CopyOptions) -> object_store::Result<()> {
        self.pass("copy", to.as_ref());
        self.inner.copy_opts(from, to, options).await
    }
}

struct World {
    /// The store every machine shares.
    objects: Arc<InMemory>,
    backend: Backend,
    dir: tempfile::TempDir,
    sched: Arc<Scheduler>,
}

impl World {
    /// A machine's view of the store, gated as `actor` (`None`: not gated).
    fn machine(&self, name: &str, actor: Option<usize>, seed: u64) -> Store {
        let backend = match actor {
            Some(actor) => Backend::from_object_store(
                Arc::new(Gated { inner: self.objects.clone(), actor, sched: self.sched.clone() }),
                format!("memory (actor {actor})"),
            ),
            None => self.backend.clone(),
        };
        let loc = StoreLocation::Custom { description: format!("memory ({name})"), dir: self.dir.path().join(name) };
        Store::open_backend(backend, &loc).unwrap().simulated(seed ^ (actor.unwrap_or(99) as u64) << 32)
    }
}

/// An image built from a pool of blocks, so images share chunks.
fn image(pool: &[Vec<u8>], rng: &mut StdRng) -> Vec<u8> {
    (0..rng.random_range(2..7)).flat_map(|_| pool[rng.random_range(0..pool.len())].clone()).collect()
}

fn push_image(
    store: &gstore_store::IndexedStore,
    dir: &std::path::Path,
    tag: &str,
    data: &[u8],
    pushed: &Pushed,
) -> Result<(), StoreError> {
    let src = dir.join(tag);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("data"), data).unwrap();
    let r = gstore_store::commands::push::push(store, &src, &TagRef::parse(tag)?, Default::default(), &Silent)?;
    pushed.lock().unwrap().insert(r.manifest, data.to_vec());
    Ok(())
}

const TAGS: [&str; 4] = ["m0-a", "m0-b", "m1-a", "m1-b"];

/// A request's key with what differs between runs of one seed masked: lease names are
/// random. (Manifest ids are not: pushes record `SOURCE_DATE_EPOCH`, see [`fixed_clock`].)
fn masked(key: String) -> String {
    match key.strip_prefix("leases/") {
        Some(_) => "leases/*".into(),
        None => key,
    }
}

/// Pins the creation time pushes record, so a manifest's id depends on its content alone and
/// a seed replays the same requests whatever the wall clock does (gc handles manifests in id
/// order). Set once, before any test of this process pushes.
fn fixed_clock() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("SOURCE_DATE_EPOCH", "1790000000"));
}

/// A seed's machines' indexes: in memory (/dev/shm) where there is one. Each seed creates and
/// deletes hundreds of RocksDB files; ext4's inode allocator spent a fifth of the run on them.
fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let mut dir = tempfile::Builder::new();
    dir.prefix("gc_sim-");
    if shm.is_dir() { dir.tempdir_in(shm) } else { dir.tempdir() }.unwrap()
}

/// Runs one seed and returns the requests in the order they went through.
fn run_seed(seed: u64) -> Vec<(usize, &'static str, String)> {
    fixed_clock();
    let mut rng = StdRng::seed_from_u64(seed);
    let objects = Arc::new(InMemory::new());
    let backend = Backend::from_object_store(objects.clone(), "memory");
    let world = World { objects, backend, dir: scratch_dir(), sched: Arc::default() };
    let loc = StoreLocation::Custom { description: "memory".into(), dir: world.dir.path().join("init") };
    Store::init_backend(&world.backend, &loc, &config()).unwrap();
    let pool: Vec<Vec<u8>> = (0..10).map(|_| (0..3000).map(|_| rng.random::<u8>()).collect()).collect();
    let pushed: Pushed = Arc::default();
    let src = world.dir.path().join("src");

    // Two images before anything runs concurrently, so gc and rm have work from the start.
    let setup = world.machine("setup", None, seed).with_index(&|_| {}).unwrap();
    for tag in &TAGS[..2] {
        push_image(&setup, &src.join("setup"), tag, &image(&pool, &mut rng), &pushed).unwrap();
    }
    drop(setup);

    // The actors' plans are drawn up front from the seed.
    let plans: Vec<Vec<Vec<u8>>> = (0..2).map(|_| (0..3).map(|_| image(&pool, &mut rng)).collect()).collect();
    let rm_plan: Vec<(bool, usize)> = (0..3).map(|_| (rng.random_bool(0.5), rng.random_range(0..TAGS.len()))).collect();
    let policies: Vec<Policy> = (0..3)
        .map(|_| match rng.random_range(0..3) {
            0 => Policy { keep_last: Some(1), ..Default::default() },
            _ => Policy::default(),
        })
        .collect();
    world.sched.turns.lock().unwrap().running = (0..4).collect();

    std::thread::scope(|s| {
        for (m, plan) in plans.iter().enumerate() {
            let (world, pushed, src) = (&world, &pushed, &src);
            s.spawn(move || {
                let _finish = Finish(&world.sched, m);
                let store = world.machine(&format!("m{m}"), Some(m), seed).with_index(&|_| {}).unwrap();
                for (k, data) in plan.iter().enumerate() {
                    let tag = format!("m{m}-{}", ["a", "b"][k % 2]);
                    push_image(&store, &src.join(format!("m{m}")), &tag, data, pushed).unwrap();
                }
            });
        }
        let world_ref = &world;
        s.spawn(move || {
            let _finish = Finish(&world_ref.sched, 2);
            let store = world_ref.machine("rm", Some(2), seed).with_index(&|_| {}).unwrap();
            for (n, &(copy, t)) in rm_plan.iter().enumerate() {
                let tag = TagRef::parse(TAGS[t]).unwrap();
                if copy {
                    // `gstore tag`: may be refused while gc has part of the image tombstoned.
                    let target = TagRef::parse(&format!("copy-{n}")).unwrap();
                    if let Ok(Some(rec)) = store.get_tag(&tag) {
                        match store.tag_existing(&target, rec.manifest_id().unwrap()) {
                            Ok(_) | Err(StoreError::Conflict(_)) | Err(StoreError::NotFound { .. }) => {}
                            Err(e) => panic!("tag copy: {e}"),
                        }
                    }
                } else {
                    match store.delete_tag(&tag) {
                        Ok(()) | Err(StoreError::NotFound { .. }) => {}
                        Err(e) => panic!("rm: {e}"),
                    }
                }
            }
        });
        s.spawn(move || {
            let _finish = Finish(&world_ref.sched, 3);
            let store = world_ref.machine("gc", Some(3), seed);
            for policy in &policies {
                let opts = GcOptions { policy: policy.clone(), ..Default::default() };
                gc::gc(&store, &opts, &Silent).unwrap();
            }
        });
        world.sched.drive(&mut rng);
    });

    let mut trace: Vec<_> = std::mem::take(&mut world.sched.turns.lock().unwrap().trace)
        .into_iter()
        .map(|(a, op, key)| (a, op, masked(key)))
        .collect();
    // gc visits manifests in id order, and ids hash the creation time: within one actor's
    // run of manifest requests, only the set is the same from run to run.
    let is_manifest = |k: &str| k.contains("manifests/*");
    let mut i = 0;
    while i < trace.len() {
        let mut j = i;
        while j < trace.len() && trace[j].0 == trace[i].0 && is_manifest(&trace[j].2) {
            j += 1;
        }
        trace[i..j].sort();
        i = j.max(i + 1);
    }
    let ctx = format!("seed {seed} ({} requests)", trace.len());
    check_images(&world, &pushed, seed, &ctx);
    // One quiet run reclaims everything no image needs, but for tombstoned packs that hold a
    // copy of a live chunk (a running restore may read them): the next run takes those.
    let gc_store = world.machine("final-gc", None, seed);
    let r = gc::gc(&gc_store, &GcOptions::default(), &Silent).unwrap();
    if std::env::var_os("GC_SIM_SEED").is_some() {
        eprintln!("{r:?}");
    }
    let left = world.backend.list(Family::Tombstones.prefix()).unwrap().len();
    assert_eq!(left, r.packs_deferred, "{ctx}: after one quiet run, only deferred packs stay tombstoned: {r:?}");
    if left > 0 {
        let r = gc::gc(&gc_store, &GcOptions::default(), &Silent).unwrap();
        assert_eq!(r.packs_deferred, 0, "{ctx}: a second quiet run defers nothing: {r:?}");
    }
    check_images(&world, &pushed, seed, &ctx);
    check_nothing_dead(&world, &ctx);
    trace
}

/// Every image any tag names restores byte-exact on a fresh machine, and verify is clean.
fn check_images(world: &World, pushed: &Pushed, seed: u64, ctx: &str) {
    static FRESH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = FRESH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let store = world.machine(&format!("check-{n}"), None, seed).with_index(&|_| {}).unwrap();
    let pushed = pushed.lock().unwrap();
    for rec in store.list_tags().unwrap() {
        let rec = rec.unwrap();
        let ids = std::iter::once(rec.manifest.clone()).chain(rec.history.iter().map(|h| h.manifest.clone()));
        for id in ids {
            let id = ObjectId::from_hex(&id).unwrap();
            let m = store.get_manifest(&id).unwrap_or_else(|e| panic!("{ctx}: {} names {id:?}: {e}", rec.tag()));
            let img = gstore_restore::host::restore_to_memory(&store, &m, gstore_restore::Budget::of(1 << 20), &Silent)
                .unwrap_or_else(|e| panic!("{ctx}: restoring {}: {e}", rec.tag()));
            assert_eq!(img.get("data"), pushed.get(&id).map(|v| &v[..]), "{ctx}: {} restored other bytes", rec.tag());
        }
    }
    let r = verify::verify(&store, true, &Silent).unwrap();
    assert!(r.damaged().is_empty(), "{ctx}: verify found damage: {:?}", r.damaged());
}

/// After the quiet runs: no tombstone, no lease, every manifest named by a tag, and every
/// pack holding at least one chunk an image needs.
fn check_nothing_dead(world: &World, ctx: &str) {
    let b = &world.backend;
    let keys = |p: &str| b.list(p).unwrap().into_iter().map(|l| l.key).collect::<Vec<_>>();
    assert!(keys(Family::Tombstones.prefix()).is_empty(), "{ctx}: tombstones left: {:?}", keys("tombstones"));
    assert!(keys(Family::Leases.prefix()).is_empty(), "{ctx}: leases left");
    let store = world.machine("final-check", None, 0);
    let mut roots = BTreeSet::new();
    let mut live = std::collections::HashSet::new();
    for rec in store.list_tags().unwrap() {
        let rec = rec.unwrap();
        for id in std::iter::once(&rec.manifest).chain(rec.history.iter().map(|h| &h.manifest)) {
            let id = ObjectId::from_hex(id).unwrap();
            live.extend(store.get_manifest(&id).unwrap().chunks.iter().filter(|c| !c.zero).map(|c| c.id));
            roots.insert(ObjectKey::Manifest(id));
        }
    }
    assert_eq!(keys(Family::Manifests.prefix()).into_iter().collect::<BTreeSet<_>>(), roots, "{ctx}: manifests");
    for l in b.list(Family::Packs.prefix()).unwrap() {
        let id = l.key.pack().unwrap();
        let entries = store.read_pack_footer(&id).unwrap();
        assert!(entries.iter().any(|e| live.contains(&e.id)), "{ctx}: pack {} holds nothing live", l.key);
    }
}

fn run_seeds(first: u64) {
    let only: Option<u64> = std::env::var("GC_SIM_SEED").ok().and_then(|s| s.parse().ok());
    for seed in first..first + SEEDS_PER_TEST {
        if only.is_none_or(|o| o == seed) {
            eprintln!("seed {seed}");
            run_seed(seed);
        }
    }
}

#[test]
fn seeds_0000_0249() {
    run_seeds(0);
}

#[test]
fn seeds_0250_0499() {
    run_seeds(250);
}

#[test]
fn seeds_0500_0749() {
    run_seeds(500);
}

#[test]
fn seeds_0750_0999() {
    run_seeds(750);
}

/// The same seed makes the same interleaving: the requests repeat exactly (lease names and
/// manifest ids aside, see `masked`).
#[test]
fn a_seed_replays_the_same_requests() {
    let a = run_seed(7);
    assert!(a.len() > 50, "a seed sends requests through the gates");
    let b = run_seed(7);
    let first_difference = a.iter().zip(&b).position(|(x, y)| x != y);
    fn around<'t>(t: &'t [(usize, &'static str, String)], i: usize) -> &'t [(usize, &'static str, String)] {
        &t[i.saturating_sub(3)..(i + 3).min(t.len())]
    }
    if let Some(i) = first_difference {
        panic!("runs differ at request {i}:\n{:?}\n{:?}", around(&a, i), around(&b, i));
    }
    assert_eq!(a.len(), b.len());
}
