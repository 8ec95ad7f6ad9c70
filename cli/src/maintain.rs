//! Store maintenance: `gstore verify`, `gstore gc` and `gstore index rebuild`.

use crate::args::GcArgs;
use crate::failure::Damaged;
use crate::output::{plural, Output};
use crate::stores::open_indexed;
use anyhow::Result;
use gstore_progress::Bars;
use gstore_store::crypto::Secret;
use gstore_store::{commands::gc, commands::verify, Store, StoreLocation};
use indicatif::HumanBytes;

/// `gstore verify`: fails when an image is damaged.
pub(crate) fn run_verify(location: &StoreLocation, read_data: bool, out: &Output, bars: &Bars) -> Result<()> {
    let backend = location.backend()?;
    if !read_data && !Secret::in_env() && Store::read_config(&backend, location)?.encryption.is_some() {
        // An encrypted store and no key given: what can be checked without one.
        let r = verify::framing(&backend, bars)?;
        out.emit(&r, || {
            let mut s = r.problems.iter().map(|p| format!("DAMAGED  {p}\n")).collect::<String>();
            s.push_str(&format!(
                "{} sealed objects and {} key records checked without the key (framing only: give the key for the full check)",
                r.objects_checked, r.key_records
            ));
            s
        })?;
        if !r.problems.is_empty() {
            return Err(Damaged(format!("{} damaged object(s)", r.problems.len())).into());
        }
        return Ok(());
    }
    let store = open_indexed(location)?;
    let r = verify::verify(&store, read_data, bars)?;
    out.emit(&r, || verify_text(&r))?;
    let damaged = r.damaged();
    if !damaged.is_empty() {
        return Err(Damaged(format!("{} damaged image(s): {}", damaged.len(), damaged.join(", "))).into());
    }
    Ok(())
}

fn verify_text(r: &verify::VerifyReport) -> String {
    let mut s = String::new();
    for i in &r.images {
        if i.ok {
            s.push_str(&format!("ok       {}\n", i.tag));
        } else {
            s.push_str(&format!("DAMAGED  {} ({})\n", i.tag, plural(i.problem_count as u64, "problem", "problems")));
            for p in &i.problems {
                s.push_str(&format!("         {p}\n"));
            }
        }
    }
    s.push_str(&format!(
        "{}, {} checked",
        plural(r.images.len() as u64, "image", "images"),
        plural(r.packs_checked as u64, "pack", "packs")
    ));
    if r.read_data {
        s.push_str(&format!(", {} chunks read ({})", r.chunks_read, HumanBytes(r.bytes_read)));
    }
    if r.damaged_copies_recorded > 0 {
        s.push_str(&format!(
            "\nrecorded {} in the store: push the images' files again (or copy them from a good store) to store good copies; gc then drops the damaged ones",
            plural(r.damaged_copies_recorded as u64, "damaged chunk copy", "damaged chunk copies")
        ));
    }
    if let Some(why) = &r.damage_not_recorded {
        s.push_str(&format!("\nthe damage found could not be recorded in the store ({why})"));
    }
    s
}

/// `gstore index rebuild`.
pub(crate) fn index_rebuild(location: &StoreLocation, out: &Output, bars: &Bars) -> Result<()> {
    // The old index is not opened: a damaged one is replaced, not an obstacle.
    let (_store, n, damaged) = Store::open(location)?.with_new_index(&|msg| eprintln!("gstore: {msg}"), bars)?;
    for d in &damaged {
        eprintln!("gstore: skipped damaged pack: {d}");
    }
    out.emit(&serde_json::json!({ "packs_indexed": n, "packs_damaged": damaged.len() }), || {
        format!("indexed {n} packs ({} damaged skipped)", damaged.len())
    })
}

pub(crate) fn run_gc(location: &StoreLocation, a: GcArgs, out: &Output, bars: &Bars) -> Result<()> {
    let store = Store::open(location)?;
    let opts = gc::GcOptions {
        policy: a.rules.policy(a.prefix),
        dry_run: a.dry_run,
        repack_below: a.repack_below,
        break_lock: a.break_lock,
        reclaim_copies: a.reclaim_copies,
    };
    let r = gc::gc(&store, &opts, bars)?;
    out.emit(&r, || gc_text(&r))
}

fn gc_text(r: &gc::GcReport) -> String {
    let would = if r.dry_run { "would be " } else { "" };
    let mut s = String::new();
    // A dry run says why each image of the names the rules cover is kept or not.
    for v in r.retention.iter().filter(|_| r.dry_run) {
        let (what, image) = (if v.current { "" } else { " (history)" }, &v.manifest[..12.min(v.manifest.len())]);
        let verb = if v.kept { "kept" } else { "would be dropped" };
        let by = v.policy.as_deref().map(|p| format!(" (policy {p})")).unwrap_or_default();
        s += &format!("{} {image}{what}: {verb}{by}: {}\n", v.tag, v.why);
    }
    for t in &r.tags_removed {
        s += &format!("tag {t} {would}removed by retention\n");
    }
    for t in &r.tags_changed_meanwhile {
        s += &format!("tag {t} changed during gc: left for the next run\n");
    }
    for l in &r.leases_dropped {
        s += &format!("lease of a dead process {would}dropped: {l}\n");
    }
    for p in &r.damaged_packs {
        s += &format!("pack {p} is damaged and was left alone: run gstore verify\n");
    }
    for m in &r.missing_manifests {
        s += &format!("manifest {m} named by a tag is missing: run gstore verify\n");
    }
    for m in &r.refused_manifests {
        s += &format!("manifest {m}; its chunks were kept: run gstore verify\n");
    }
    if r.temp_files_swept > 0 {
        s += &format!(
            "{} temporary files of killed writers {would}removed ({})\n",
            r.temp_files_swept,
            HumanBytes(r.temp_bytes_swept)
        );
    }
    if r.packs_deferred > 0 {
        s += &format!(
            "{} tombstoned packs hold copies of live chunks a running restore may read: the next run (or --reclaim-copies) deletes them ({})\n",
            r.packs_deferred,
            HumanBytes(r.bytes_deferred)
        );
    }
    s += &format!(
        "{} kept, {}; {} {would}dropped\n\
         {} ({}): {} {would}deleted ({} reclaimed), {} {would}tombstoned ({} to reclaim next run), \
         {} {would}rewritten ({} {}), {} revived\n\
         manifests: {} {would}deleted, {} {would}tombstoned, {} revived\n\
         {} in {} requests, {:.2} s",
        plural(r.images_kept as u64, "image", "images"),
        plural(r.leases_live as u64, "running push", "running pushes"),
        plural(r.history_dropped, "history entry", "history entries"),
        plural(r.packs as u64, "pack", "packs"),
        HumanBytes(r.pack_bytes),
        r.packs_deleted,
        HumanBytes(r.bytes_reclaimed),
        r.packs_tombstoned,
        HumanBytes(r.bytes_tombstoned),
        r.packs_repacked,
        HumanBytes(r.bytes_repacked),
        if r.dry_run { "to write" } else { "written" },
        r.packs_revived,
        r.manifests_deleted,
        r.manifests_tombstoned,
        r.manifests_revived,
        plural(u64::from(r.passes), "pass", "passes"),
        r.requests,
        r.seconds
    );
    s
}
