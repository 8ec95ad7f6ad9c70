//! Garbage collection: retention, then one mark-and-sweep pass that is safe while other
//! processes and machines push. docs/GC.md gives the protocol and its invariants.
//!
//! A pass, in this order:
//! 1. take the gc lock (one gc at a time; pushes never take it);
//! 2. list tombstones — only objects tombstoned *before* this point may be deleted now;
//! 3. list leases: their packs and manifests are kept; leases of provably dead owners go;
//!    so do temporary files of killed writers in a local store (listed before the leases);
//! 4. apply retention to the tags (compare-and-swap writes), then read every tag: the roots
//!    are every manifest a tag names (current value and history) plus leased manifests;
//! 5. mark: the chunks the roots name are live; each live chunk gets one home pack;
//! 6. list packs and manifests and decide: objects still needed lose their tombstone;
//!    tombstoned objects still not needed are deleted; other unneeded objects get a
//!    tombstone; packs holding little live data are rewritten (live chunks copied into a new
//!    pack, then the old one tombstoned), so their space comes back on the next pass;
//!    a deleted manifest's restore profile is deleted with it.

mod catalog;
mod lock;
pub mod policies;
pub mod retention;
mod sweep;
mod temps;

use crate::backend::{self, Backend};
use crate::error::{Result, StoreError};
use crate::format::damage::DamagedCopy;
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::lease::LeaseRecord;
use crate::format::now_unix;
use crate::format::pack::PackEntry;
use crate::format::tag::{TagRecord, TagRef};
use crate::progress::{Progress, Unit};
use crate::repo::damage;
use crate::repo::leases::Liveness;
use crate::repo::store::Store;
use catalog::Catalog;
use rayon::prelude::*;
use retention::{Outcome, Policy, Verdict};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use sweep::{Settled, Sweep};

/// What an error that stops gc before its sweep says stopped.
const STOPPED: &str = "gc stopped before deleting anything";

/// Default of [`GcOptions::repack_below`]: packs with 10 % or more dead data are rewritten,
/// so that after two passes the space of removed images is back even where their chunks
/// shared a pack with live ones (a push's first pack holds whatever it found new).
pub const DEFAULT_REPACK_BELOW: f64 = 0.9;

/// How gc runs.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Retention rules.
    pub policy: Policy,
    /// Decide and report, but write and delete nothing.
    pub dry_run: bool,
    /// Packs whose live data is below this fraction of their chunk data are rewritten.
    pub repack_below: f64,
    /// Take the gc lock even from a holder this machine cannot prove dead.
    pub break_lock: bool,
    /// Later passes delete tombstoned packs holding copies of live chunks too ([`Pass::Again`]
    /// leaves them for the next run otherwise).
    pub reclaim_copies: bool,
}

impl GcOptions {
    /// Refuses options that make no sense (see [`Policy::check`]; a repack fraction outside
    /// 0..=1) before anything is read.
    pub fn check(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.repack_below) {
            return Err(StoreError::Refused(format!(
                "repack-below must be a fraction between 0 and 1, not {}",
                self.repack_below
            )));
        }
        self.policy.check()
    }
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            policy: Policy::default(),
            dry_run: false,
            repack_below: DEFAULT_REPACK_BELOW,
            break_lock: false,
            reclaim_copies: false,
        }
    }
}

/// What a gc pass did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Nothing was written or deleted.
    pub dry_run: bool,
    /// Tags retention removed.
    pub tags_removed: Vec<String>,
    /// What retention decided for each image of the names its rules cover, and why (empty
    /// without rules).
    pub retention: Vec<Verdict>,
    /// History entries retention dropped.
    pub history_dropped: u64,
    /// Tags retention left alone because another writer changed them meanwhile.
    pub tags_changed_meanwhile: Vec<String>,
    /// Images (manifests) the tags name, current values and history, all kept.
    pub images_kept: usize,
    /// Leases of running pushes (their packs and manifests were kept).
    pub leases_live: usize,
    /// Leases whose owner is provably dead here, dropped.
    pub leases_dropped: Vec<String>,
    /// Packs in the store when listed.
    pub packs: usize,
    /// Bytes of those packs.
    pub pack_bytes: u64,
    /// Packs left tombstoned by this run (found unneeded by its last pass; the next run
    /// deletes them unless they are needed again).
    pub packs_tombstoned: usize,
    /// Bytes of those packs.
    pub bytes_tombstoned: u64,
    /// Packs deleted by this run (tombstoned by an earlier pass, this run's first included,
    /// and still unneeded).
    pub packs_deleted: usize,
    /// Tombstoned, unneeded packs this run's later passes left for the next run because
    /// they hold a copy of a live chunk (a restore running now may read it there).
    pub packs_deferred: usize,
    /// Bytes of those packs.
    pub bytes_deferred: u64,
    /// Bytes of those packs: space reclaimed.
    pub bytes_reclaimed: u64,
    /// Tombstoned packs that were needed again and kept.
    pub packs_revived: usize,
    /// Mostly-dead packs rewritten.
    pub packs_repacked: usize,
    /// Bytes written into new packs by rewriting (with `dry_run`: the chunk bytes a rewrite
    /// would write).
    pub bytes_repacked: u64,
    /// Manifests tombstoned, deleted and revived.
    pub manifests_tombstoned: usize,
    /// Manifests deleted.
    pub manifests_deleted: usize,
    /// Manifests revived.
    pub manifests_revived: usize,
    /// Damaged packs (left untouched; `gstore verify` names the images they break).
    pub damaged_packs: Vec<String>,
    /// Manifests tags name that are missing.
    pub missing_manifests: Vec<String>,
    /// Manifests (id: why) that match their ids but that readers refuse (an entry below a
    /// symlink, say): their chunks were kept, and `gstore verify` names their images.
    pub refused_manifests: Vec<String>,
    /// Temporary files of killed writers removed from a local store's directory.
    pub temp_files_swept: usize,
    /// Bytes of those files.
    pub temp_bytes_swept: u64,
    /// Requests sent to the store.
    pub requests: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Passes run: one, and another after each that tombstoned anything (which deletes it),
    /// at most four.
    pub passes: u32,
}

impl GcReport {
    /// Adds a later pass's work to this report: what it deleted, revived,
    /// rewrote and swept adds up; what is left tombstoned, kept, leased, damaged or missing is
    /// as the second pass found it; retention is the first's alone.
    fn absorb(&mut self, second: GcReport) {
        self.images_kept = second.images_kept;
        self.leases_live = second.leases_live;
        self.leases_dropped.extend(second.leases_dropped);
        self.packs_tombstoned = second.packs_tombstoned;
        self.bytes_tombstoned = second.bytes_tombstoned;
        self.packs_deleted += second.packs_deleted;
        self.packs_deferred = second.packs_deferred;
        self.bytes_deferred = second.bytes_deferred;
        self.bytes_reclaimed += second.bytes_reclaimed;
        self.packs_revived += second.packs_revived;
        self.packs_repacked += second.packs_repacked;
        self.bytes_repacked += second.bytes_repacked;
        self.manifests_tombstoned = second.manifests_tombstoned;
        self.manifests_deleted += second.manifests_deleted;
        self.manifests_revived += second.manifests_revived;
        self.damaged_packs = second.damaged_packs;
        self.missing_manifests = second.missing_manifests;
        self.refused_manifests = second.refused_manifests;
        self.temp_files_swept += second.temp_files_swept;
        self.temp_bytes_swept += second.temp_bytes_swept;
        self.passes += second.passes;
    }
}

/// One listed pack with what the mark found in it.
struct PackInfo {
    id: ObjectId,
    size: u64,
    entries: Vec<PackEntry>,
    tombstoned: bool,
    protected: bool,
    /// Stored bytes of live chunks in it (whether or not it is their home), live delta bases
    /// included.
    live_bytes: u64,
}

impl PackInfo {
    /// Order of preference as a home for a live chunk: leased, staying (needed and not to be
    /// rewritten), not tombstoned, fuller, lower id.
    fn rank(&self, staying: &HashSet<ObjectId>) -> (bool, bool, bool, u64, std::cmp::Reverse<ObjectId>) {
        let fill = self.live_bytes * 1_000_000 / self.data_bytes().max(1);
        let stays = staying.contains(&self.id);
        // A tombstoned pack that stays is revived: it ranks as if it had no tombstone, so the
        // next pass, seeing no tombstone, chooses the same homes.
        (self.protected, stays, stays || !self.tombstoned, fill, std::cmp::Reverse(self.id))
    }

    /// Stored bytes of all its chunks (the pack without header, footer and trailer).
    fn data_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.stored_len as u64).sum()
    }
}

/// Most passes one gc run makes.
const MAX_PASSES: u32 = 4;

/// Runs retention and gc over `store` (opened without its index): one pass, then, as long as
/// the last one tombstoned anything (and at most [`MAX_PASSES`] in all), another that deletes
/// what is still unneeded, so that one run reclaims the space. Each is an ordinary pass
/// (docs/GC.md's argument needs no time between passes); only the first applies retention,
/// and the report adds the later ones' work to its own. A quiet store is settled after two
/// passes, now and then three (tests/gc_sim.rs found such a schedule).
pub fn gc(store: &Store, opts: &GcOptions, progress: &dyn Progress) -> Result<GcReport> {
    opts.check()?;
    let started = std::time::Instant::now();
    let b = store.backend();
    let requests_before = b.requests();
    let _lock = if opts.dry_run { None } else { Some(lock::GcLock::take(b, opts.break_lock)?) };
    let mut report = pass(store, opts, Pass::First, progress)?;
    while !opts.dry_run && report.packs_tombstoned + report.manifests_tombstoned > 0 && report.passes < MAX_PASSES {
        let next = pass(store, opts, Pass::Again, progress)?;
        report.absorb(next);
    }
    report.requests = b.requests() - requests_before;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Which pass of a run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The first: retention (the flags and stored policies) decides which tags stay, and what
    /// earlier runs tombstoned and is still unneeded is deleted.
    First,
    /// A later one: every tag stays as it is, and of what is tombstoned and unneeded only
    /// packs without a copy of a live chunk are deleted (unless
    /// [`GcOptions::reclaim_copies`]). One that holds such a copy (a pack just rewritten, a
    /// duplicate) may be what a restore running now was planned to read: it waits for the
    /// next run, as it did when every run was one pass.
    Again,
}

/// One gc pass, under the caller's gc lock.
fn pass(store: &Store, opts: &GcOptions, which: Pass, progress: &dyn Progress) -> Result<GcReport> {
    let b = store.backend();
    let mut report = GcReport { dry_run: opts.dry_run, passes: 1, ..Default::default() };
    let catalog = Catalog::new(store);
    // Temporary files of a local store, listed before leases are read (temps.rs).
    let temp_files = temps::list(b)?;

    // 2. Tombstones first: only these may be deleted by this pass.
    let tombstones: BTreeSet<ObjectKey> =
        b.list(Family::Tombstones.prefix())?.iter().filter_map(|l| Some(l.key.tombstoned()?.clone())).collect();

    // 3. Leases; then the temporary files no live lease covers go.
    let leases = read_leases(b, opts.dry_run, &mut report)?;
    temps::sweep(temp_files, &leases, opts.dry_run, &mut report)?;
    let Leases { packs: leased_packs, manifests: leased_manifests, .. } = leases;

    // 4. Retention, then the roots.
    let mut tagged: BTreeSet<ObjectId> = BTreeSet::new();
    for rec in apply_retention(store, &catalog, opts, which, &mut report)? {
        tagged.insert(rec.manifest_id()?);
        for h in &rec.history {
            // A history entry with a damaged id names nothing gc could keep.
            tagged.extend(ObjectId::from_hex(&h.manifest).ok());
        }
    }
    report.images_kept = tagged.len();
    let mut roots: BTreeSet<ObjectId> = tagged.iter().chain(&leased_manifests).copied().collect();

    // 5. Mark (the images the roots use join them), then read the packs and settle each live
    // chunk's home.
    let mut live = mark(store, &catalog, &mut roots, &tagged, progress, &mut report)?;
    let listed = b.list(Family::Packs.prefix())?;
    let (damaged, damage_records) = damage::read_all(b)?;
    let mut packs = read_packs(store, &catalog, &listed, &tombstones, &leased_packs, progress, &mut report)?;
    // The bases of live delta chunks are live too (one step: a base is never a delta).
    let copies = Copies::of(&packs, &live, damaged);
    live.extend(copies.bases.iter().copied());
    for p in &mut packs {
        p.live_bytes =
            p.entries.iter().filter(|e| live.contains(&e.id) && copies.may_home(e)).map(|e| e.stored_len as u64).sum();
    }
    let rewrite = Rewrite { below: opts.repack_below, min_dead: (store.config().pack_target / 4).min(64 << 10) };
    let (homes, home_bytes) = settle_homes(&packs, &live, &copies, &rewrite);

    // 6. Decide.
    let sweep = Sweep {
        store,
        catalog: &catalog,
        dry_run: opts.dry_run,
        damage_records: &damage_records,
        keep_live_copies: which == Pass::Again && !opts.reclaim_copies,
    };
    sweep_packs(&sweep, &packs, &homes, &home_bytes, &copies, &rewrite, progress, &mut report)?;
    let manifests = b.list(Family::Manifests.prefix())?;
    for l in &manifests {
        let Some(id) = l.key.manifest() else { continue };
        let key = ObjectKey::Manifest(id);
        match sweep.settle(&key, roots.contains(&id), tombstones.contains(&key))? {
            Settled::Revived => report.manifests_revived += 1,
            Settled::Deleted => {
                report.manifests_deleted += 1;
                // The image's restore profile (if it has one) goes with it.
                if !opts.dry_run {
                    b.delete(&ObjectKey::Profile(id))?;
                }
            }
            Settled::Tombstoned => report.manifests_tombstoned += 1,
            Settled::Kept => {}
        }
    }

    // Tombstones of objects that were already gone when listed (a gc stopped between the
    // two deletes), and damage records of packs that are gone.
    if !opts.dry_run {
        let present: HashSet<&ObjectKey> = listed.iter().chain(&manifests).map(|l| &l.key).collect();
        for t in tombstones.iter().filter(|t| !present.contains(t)) {
            b.delete(&t.tombstone())?;
        }
        for p in damage_records.iter().filter(|p| !present.contains(&ObjectKey::Pack(**p))) {
            b.delete(&ObjectKey::Damage(*p))?;
        }
    }
    report.tags_removed.sort();
    Ok(report)
}

/// The non-zero chunks of every root manifest and of the images they use ([`crate::format::meta::ImageMeta::uses`],
/// followed to the end), which join `roots`. A tagged or used manifest that is missing is
/// reported; a leased one may not be written yet. One whose entries readers refuse is
/// reported and its chunks kept; one that does not match its id or parse stops gc.
fn mark(
    store: &Store,
    catalog: &Catalog,
    roots: &mut BTreeSet<ObjectId>,
    tagged: &BTreeSet<ObjectId>,
    progress: &dyn Progress,
    report: &mut GcReport,
) -> Result<HashSet<ObjectId>> {
    progress.start("gc: reading manifests", roots.len() as u64, Unit::Items);
    // Chunks go into the set as each manifest arrives, so manifests are not all held at once.
    let live = std::sync::Mutex::new(HashSet::new());
    let mut wave: Vec<ObjectId> = roots.iter().copied().collect();
    let mut used = BTreeSet::new();
    while !wave.is_empty() {
        let reads = in_flight(store, &wave, |id| {
            let read = catalog.manifest_references(id).map(|refs| {
                live.lock().expect("live set lock").extend(refs.chunks.iter().filter(|c| !c.zero).map(|c| c.id));
                (refs.refused, refs.uses)
            });
            progress.advance(1);
            read
        })?;
        let mut next = Vec::new();
        for (id, read) in wave.iter().zip(reads) {
            match read {
                Ok((refused, uses)) => {
                    // Its chunks are kept; what readers refuse in it is reported, never a
                    // reason to stop.
                    if let Some(why) = refused {
                        report.refused_manifests.push(format!("{}: {why}", id.to_hex()));
                    }
                    for u in uses {
                        if roots.insert(u) {
                            used.insert(u);
                            next.push(u);
                        }
                    }
                }
                // A leased manifest may not be written yet: its push is still running.
                Err(StoreError::NotFound { .. }) if !tagged.contains(id) && !used.contains(id) => {}
                Err(StoreError::NotFound { .. }) => report.missing_manifests.push(id.to_hex()),
                Err(e) => {
                    return Err(
                        e.stopped(STOPPED, format!("manifest {} cannot be read: run gstore verify", id.to_hex()))
                    )
                }
            }
        }
        wave = next;
    }
    progress.finish();
    Ok(live.into_inner().expect("live set lock"))
}

/// Reads the footer of every listed pack (cached for a remote store); the caller counts the
/// live bytes in each. Damaged packs are reported and left out: nothing is decided about them.
#[allow(clippy::too_many_arguments)]
fn read_packs(
    store: &Store,
    catalog: &Catalog,
    listed: &[backend::Listed],
    tombstones: &BTreeSet<ObjectKey>,
    leased: &HashSet<ObjectId>,
    progress: &dyn Progress,
    report: &mut GcReport,
) -> Result<Vec<PackInfo>> {
    let pack_list: Vec<(ObjectId, &backend::Listed)> = listed.iter().filter_map(|l| Some((l.key.pack()?, l))).collect();
    progress.start("gc: reading pack footers", pack_list.len() as u64, Unit::Items);
    let footers = in_flight(store, &pack_list, |(id, l)| {
        let f = catalog.footer(id, l.size);
        progress.advance(1);
        f
    })?;
    progress.finish();
    let mut packs = Vec::new();
    for ((id, l), footer) in pack_list.into_iter().zip(footers) {
        report.packs += 1;
        report.pack_bytes += l.size;
        match footer {
            Ok(entries) => {
                packs.push(PackInfo {
                    id,
                    size: l.size,
                    entries,
                    tombstoned: tombstones.contains(&ObjectKey::Pack(id)),
                    protected: leased.contains(&id),
                    live_bytes: 0,
                });
            }
            Err(e) if e.is_damage() => report.damaged_packs.push(id.to_hex()),
            Err(e) => return Err(e),
        }
    }
    Ok(packs)
}

/// Which stored entries are copies a live chunk may be kept in. A delta is a copy only while
/// each of its bases is stored whole in some listed pack: a pack that stays for its other
/// chunks keeps dead deltas whose bases an earlier pass deleted, and such an orphan must never
/// become a chunk's home (docs/GC.md). A chunk that is a base of a live delta is kept whole. A
/// copy a damage record names is a home only where the chunk has no other copy.
struct Copies {
    /// Chunks stored whole (not as a delta) in some listed pack.
    whole: HashSet<ObjectId>,
    /// The bases of live delta chunks that are copies.
    bases: HashSet<ObjectId>,
    /// Copies damage records name.
    damaged: HashSet<DamagedCopy>,
}

impl Copies {
    fn of(packs: &[PackInfo], live: &HashSet<ObjectId>, damaged: HashSet<DamagedCopy>) -> Copies {
        let entries = || packs.iter().flat_map(|p| &p.entries);
        let whole: HashSet<ObjectId> = entries().filter(|e| e.bases.is_none()).map(|e| e.id).collect();
        let mut copies = Copies { whole, bases: HashSet::new(), damaged };
        let bases: HashSet<ObjectId> = entries()
            .filter(|e| live.contains(&e.id) && copies.bases_whole(e))
            .flat_map(|e| e.bases)
            .flat_map(|b| b.iter())
            .collect();
        copies.bases = bases;
        copies
    }

    /// True when every base of `e` (none unless it is a delta) is stored whole.
    fn bases_whole(&self, e: &PackEntry) -> bool {
        e.bases.iter().flat_map(|b| b.iter()).all(|b| self.whole.contains(&b))
    }

    /// True when `e` may be the home of its chunk: stored whole, or a delta whose bases are
    /// stored whole and that no live delta needs as a base.
    fn may_home(&self, e: &PackEntry) -> bool {
        e.bases.is_none() || (self.bases_whole(e) && !self.bases.contains(&e.id))
    }

    /// True when a damage record names the copy of `e` in `pack`.
    fn is_damaged(&self, e: &PackEntry, pack: &ObjectId) -> bool {
        self.damaged.contains(&(e.id, *pack))
    }

    /// True when `p` holds a damaged copy that is not its chunk's home (so another copy, or
    /// none, is kept): rewriting `p` drops it.
    fn drops_damage(&self, p: &PackInfo, homes: &HashMap<ObjectId, ObjectId>) -> bool {
        p.entries.iter().any(|e| self.is_damaged(e, &p.id) && homes.get(&e.id) != Some(&p.id))
    }
}

/// When a pack is worth rewriting.
struct Rewrite {
    /// `--repack-below`: live data below this fraction of the chunk data.
    below: f64,
    /// ...and at least this many dead bytes to free.
    min_dead: u64,
}

impl Rewrite {
    /// True when `p`, home to `home` live bytes, stays as it is: leased, or home to enough.
    fn stays(&self, p: &PackInfo, home: u64) -> bool {
        let data = p.data_bytes();
        p.protected || (home > 0 && ((home as f64) >= self.below * data as f64 || data - home < self.min_dead))
    }
}

/// Each live chunk's home pack, and the stored bytes each pack is home to.
///
/// Which packs stay: start from every pack without a tombstone; add tombstoned packs that
/// are the best home left for some chunk (they will be revived) and drop packs that would be
/// home to too little, until the set settles. Staying packs are preferred as homes, so a
/// chunk a staying pack holds is kept there and rewriting copies only what lives nowhere
/// else. The next pass starts from the same set (none of it tombstoned then) and settles on
/// the same homes: it rewrites nothing more.
fn settle_homes(
    packs: &[PackInfo],
    live: &HashSet<ObjectId>,
    copies: &Copies,
    rewrite: &Rewrite,
) -> (HashMap<ObjectId, ObjectId>, HashMap<ObjectId, u64>) {
    let mut staying: HashSet<ObjectId> = packs.iter().filter(|p| p.protected || !p.tombstoned).map(|p| p.id).collect();
    let (mut homes, mut home_bytes) = pick_homes(packs, live, copies, &staying);
    for _ in 0..16 {
        let next: HashSet<ObjectId> = packs
            .iter()
            .filter(|p| {
                let home = home_bytes.get(&p.id).copied().unwrap_or(0);
                (staying.contains(&p.id) || p.tombstoned) && rewrite.stays(p, home)
            })
            .map(|p| p.id)
            .collect();
        if next == staying {
            break;
        }
        staying = next;
        (homes, home_bytes) = pick_homes(packs, live, copies, &staying);
    }
    (homes, home_bytes)
}

/// Decides every pack: needed ones keep (or lose) their tombstone, unneeded ones are
/// tombstoned or, if tombstoned before, deleted; packs home to too little, or holding a
/// damaged copy that another copy (or none) replaces, are rewritten, then tombstoned.
#[allow(clippy::too_many_arguments)]
fn sweep_packs(
    sweep: &Sweep,
    packs: &[PackInfo],
    homes: &HashMap<ObjectId, ObjectId>,
    home_bytes: &HashMap<ObjectId, u64>,
    copies: &Copies,
    rewrite: &Rewrite,
    progress: &dyn Progress,
    report: &mut GcReport,
) -> Result<()> {
    let mut to_repack = Vec::new();
    for p in packs {
        let home = home_bytes.get(&p.id).copied().unwrap_or(0);
        let needed = p.protected || home > 0;
        if sweep.keep_live_copies && p.tombstoned && !needed && p.live_bytes > 0 {
            report.packs_deferred += 1;
            report.bytes_deferred += p.size;
            continue;
        }
        if needed && !p.protected && (!rewrite.stays(p, home) || copies.drops_damage(p, homes)) {
            // Rewritten, then tombstoned (a tombstone it already has stays).
            to_repack.push(p);
            continue;
        }
        match sweep.settle(&ObjectKey::Pack(p.id), needed, p.tombstoned)? {
            Settled::Revived => report.packs_revived += 1,
            Settled::Deleted => {
                report.packs_deleted += 1;
                report.bytes_reclaimed += p.size;
            }
            Settled::Tombstoned => {
                report.packs_tombstoned += 1;
                report.bytes_tombstoned += p.size;
            }
            Settled::Kept => {}
        }
    }
    let repacked = sweep.repack(&to_repack, packs, homes, progress, report)?;
    for p in to_repack {
        let key = ObjectKey::Pack(p.id);
        if !repacked.iter().any(|r| r.id == p.id) {
            // Could not be rewritten (damaged): still needed.
            if p.tombstoned {
                sweep.revive(&key)?;
                report.packs_revived += 1;
            }
        } else if !p.tombstoned {
            sweep.tombstone(&key)?;
            report.packs_tombstoned += 1;
            report.bytes_tombstoned += p.size;
        }
    }
    Ok(())
}

/// Maps `f` over `items` with [`Store::reads_in_flight`] calls at once, keeping the order.
fn in_flight<T: Sync, R: Send>(store: &Store, items: &[T], f: impl Fn(&T) -> R + Sync) -> Result<Vec<R>> {
    let n = store.reads_in_flight();
    if n <= 1 {
        return Ok(items.iter().map(f).collect());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| StoreError::Internal(format!("starting gc read threads: {e}")))?;
    Ok(pool.install(|| items.par_iter().map(&f).collect()))
}

/// What the leases of a store say, as one pass read them.
#[derive(Default)]
pub(super) struct Leases {
    /// The packs live leases protect.
    pub packs: HashSet<ObjectId>,
    /// The manifests live leases protect.
    pub manifests: HashSet<ObjectId>,
    /// The keys of the leases whose owner is provably dead (deleted by this pass).
    pub dead: HashSet<ObjectKey>,
}

/// Reads every lease. Leases whose owner is provably dead here are deleted (unless
/// `dry_run`). A damaged lease stops gc: what it protects is unknown.
fn read_leases(b: &Backend, dry_run: bool, report: &mut GcReport) -> Result<Leases> {
    let mut leases = Leases::default();
    for l in b.list(Family::Leases.prefix())? {
        let Some(bytes) = b.get_opt(&l.key)? else { continue };
        let rec = LeaseRecord::from_json(&bytes, &l.key.to_string())
            .map_err(|e| StoreError::from(e).stopped(STOPPED, format!("delete {} if no push is running", l.key)))?;
        if rec.owner.is_dead_here() {
            report.leases_dropped.push(format!("{} ({})", rec.purpose, rec.owner.describe()));
            if !dry_run {
                b.delete(&l.key)?;
            }
            leases.dead.insert(l.key);
            continue;
        }
        report.leases_live += 1;
        leases.packs.extend(rec.pack_ids());
        leases.manifests.extend(rec.manifest_ids());
    }
    Ok(leases)
}

/// The tag records one retention policy decides.
struct RetentionGroup<'p> {
    /// The stored policy's pattern; `None`: the command line's rules.
    pattern: Option<String>,
    policy: &'p Policy,
    /// Where the records are in the list of all.
    members: Vec<usize>,
    records: Vec<TagRecord>,
}

/// The records of `recs` each policy decides: those of names a stored policy covers by that
/// policy, the others by the command line's `given`; groups without records are left out.
fn retention_groups<'p>(
    recs: &[TagRecord],
    stored: &'p policies::Policies,
    given: &'p Policy,
) -> Vec<RetentionGroup<'p>> {
    let mut by_pattern: BTreeMap<Option<&str>, Vec<usize>> = BTreeMap::new();
    for (i, r) in recs.iter().enumerate() {
        by_pattern.entry(stored.for_name(&r.name).map(|(p, _)| p)).or_default().push(i);
    }
    by_pattern
        .into_iter()
        .map(|(pattern, members)| RetentionGroup {
            pattern: pattern.map(str::to_string),
            policy: pattern.map_or(given, |p| &stored.policies[p]),
            records: members.iter().map(|&i| recs[i].clone()).collect(),
            members,
        })
        .collect()
}

/// Applies retention to every tag (compare-and-swap writes) and returns the records that
/// remain. A tag another writer changed meanwhile is kept whole, as re-read.
fn apply_retention(
    store: &Store,
    catalog: &Catalog,
    opts: &GcOptions,
    which: Pass,
    report: &mut GcReport,
) -> Result<Vec<TagRecord>> {
    let b = store.backend();
    // Keys under tags/ that are no tag gstore could write name nothing.
    let tags: Vec<TagRef> = b
        .list(Family::Tags.prefix())?
        .iter()
        .filter_map(|l| match &l.key {
            ObjectKey::Tag(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let mut records = Vec::new();
    for (tag, read) in tags.iter().zip(in_flight(store, &tags, |t| store.get_tag_versioned(t))?) {
        let read = read.map_err(|e| e.stopped(STOPPED, format!("fix or remove tag {tag}")))?;
        if let Some((rec, v)) = read.filter(|(r, _)| r.removed_unix.is_none()) {
            records.push((rec, v));
        }
    }
    let recs: Vec<TagRecord> = records.iter().map(|(r, _)| r.clone()).collect();
    if which == Pass::Again {
        return Ok(recs);
    }
    let stored = policies::read(store)?;
    // Each name goes by its stored policy, else by the command line's rules.
    let groups = retention_groups(&recs, &stored, &opts.policy);
    // Creation times, read as many at once as the mark reads manifests.
    let dated: Vec<&str> =
        groups.iter().flat_map(|g| g.policy.dated(&g.records)).collect::<BTreeSet<&str>>().into_iter().collect();
    let created =
        in_flight(store, &dated, |hex| ObjectId::from_hex(hex).ok().and_then(|id| catalog.manifest_created(&id)))?;
    let made: HashMap<&str, u64> = dated.iter().zip(created).filter_map(|(hex, t)| Some((*hex, t?))).collect();
    let (now, mut outcomes) = (now_unix(), vec![Outcome::Keep; recs.len()]);
    for g in &groups {
        let (decided, verdicts) = g.policy.decide(&g.records, now, &|hex| made.get(hex).copied());
        for (&i, outcome) in g.members.iter().zip(decided) {
            outcomes[i] = outcome;
        }
        report.retention.extend(verdicts.into_iter().map(|v| Verdict { policy: g.pattern.clone(), ..v }));
    }
    let mut kept = Vec::new();
    for ((rec, version), outcome) in records.into_iter().zip(outcomes) {
        let new = match outcome {
            Outcome::Keep => {
                kept.push(rec);
                continue;
            }
            Outcome::Trim(trimmed, dropped) => {
                report.history_dropped += dropped as u64;
                Some(trimmed)
            }
            Outcome::Remove => {
                report.tags_removed.push(rec.tag().to_string());
                None
            }
        };
        if opts.dry_run {
            kept.extend(new);
            continue;
        }
        let write = new.clone().unwrap_or_else(|| TagRecord { removed_unix: Some(now_unix()), ..rec.clone() });
        match store.put_tag(&write, Some(&version)) {
            Ok(()) => kept.extend(new),
            Err(StoreError::Conflict(_)) => {
                report.tags_changed_meanwhile.push(rec.tag().to_string());
                if new.is_none() {
                    report.tags_removed.pop();
                }
                // Keep whatever it names now (it may be gone again: then nothing).
                kept.extend(store.get_tag(&rec.tag())?);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(kept)
}

/// For each live chunk, the one pack gc keeps it in (the best-ranked holder of a copy), and
/// the stored bytes each pack is home to.
fn pick_homes(
    packs: &[PackInfo],
    live: &HashSet<ObjectId>,
    copies: &Copies,
    staying: &HashSet<ObjectId>,
) -> (HashMap<ObjectId, ObjectId>, HashMap<ObjectId, u64>) {
    // Per chunk: the best holder so far, its stored length and whether it is undamaged.
    let mut best: HashMap<ObjectId, (usize, u32, bool)> = HashMap::new();
    for (i, p) in packs.iter().enumerate() {
        for e in p.entries.iter().filter(|e| live.contains(&e.id) && copies.may_home(e)) {
            let sound = !copies.is_damaged(e, &p.id);
            let slot = best.entry(e.id).or_insert((i, e.stored_len, sound));
            if (slot.2, packs[slot.0].rank(staying)) < (sound, p.rank(staying)) {
                *slot = (i, e.stored_len, sound);
            }
        }
    }
    let mut bytes: HashMap<ObjectId, u64> = HashMap::new();
    for &(i, len, _) in best.values() {
        *bytes.entry(packs[i].id).or_default() += len as u64;
    }
    (best.into_iter().map(|(c, (i, _, _))| (c, packs[i].id)).collect(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Codec, DeltaBases};

    fn entry(name: &[u8], bases: Option<DeltaBases>) -> PackEntry {
        let codec = if bases.is_some() { Codec::Delta } else { Codec::Zstd };
        PackEntry { id: ObjectId::of(name), offset: 24, stored_len: 1000, plain_len: 4000, codec, bases }
    }

    fn pack(id: u8, entries: Vec<PackEntry>) -> PackInfo {
        let live_bytes = entries.iter().map(|e| e.stored_len as u64).sum();
        PackInfo { id: ObjectId([id; 32]), size: 1 << 20, entries, tombstoned: false, protected: false, live_bytes }
    }

    #[test]
    fn an_orphan_delta_is_never_a_home() {
        // Pack 1 stays for chunk "kept" and still holds a dead delta of "chunk" whose base an
        // earlier pass deleted; pack 2 holds "chunk" whole. Pack 1 ranks first (lower id).
        let orphan = entry(b"chunk", Some(DeltaBases::one(ObjectId::of(b"gone"))));
        let packs = vec![pack(1, vec![entry(b"kept", None), orphan]), pack(2, vec![entry(b"chunk", None)])];
        let live: HashSet<ObjectId> = [ObjectId::of(b"kept"), ObjectId::of(b"chunk")].into();
        let copies = Copies::of(&packs, &live, HashSet::new());
        assert!(copies.bases.is_empty(), "an orphan's bases are not made live");
        let rewrite = Rewrite { below: 0.0, min_dead: 0 };
        let (homes, _) = settle_homes(&packs, &live, &copies, &rewrite);
        assert_eq!(homes[&ObjectId::of(b"chunk")], ObjectId([2; 32]));
        assert_eq!(homes[&ObjectId::of(b"kept")], ObjectId([1; 32]));
    }

    #[test]
    fn a_live_deltas_base_is_kept_whole_and_the_delta_may_be_home() {
        let base = ObjectId::of(b"base");
        // "base" is stored whole in pack 3 and as a delta (of something else) in pack 1; the
        // live delta of "chunk" in pack 2 needs it.
        let packs = vec![
            pack(1, vec![entry(b"base", Some(DeltaBases::one(ObjectId::of(b"other")))), entry(b"other", None)]),
            pack(2, vec![entry(b"chunk", Some(DeltaBases::one(base)))]),
            pack(3, vec![entry(b"base", None)]),
        ];
        let live: HashSet<ObjectId> = [ObjectId::of(b"chunk")].into();
        let copies = Copies::of(&packs, &live, HashSet::new());
        let mut live = live;
        live.extend(copies.bases.iter().copied());
        let (homes, _) = settle_homes(&packs, &live, &copies, &Rewrite { below: 0.0, min_dead: 0 });
        assert_eq!(homes[&ObjectId::of(b"chunk")], ObjectId([2; 32]));
        assert_eq!(homes[&base], ObjectId([3; 32]), "a base is homed where it is whole");
    }
}
