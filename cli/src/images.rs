//! The store's images: `ls`, `show`, `log`, `diff`, `du`, `tag`, `pin` / `unpin`, `rm`, `copy`.

use crate::args::Sort;
use crate::failure::Usage;
use crate::output::{plural, rate, Output};
use crate::stores::open_indexed;
use anyhow::{Context, Result};
use gstore_progress::Bars;
use gstore_store::{
    commands::images, commands::usage, IndexedStore, ObjectKind, Store, StoreError, StoreLocation, TagRef,
};
use indicatif::HumanBytes;

/// `gstore ls`.
pub(crate) fn ls(store: &Store, name: Option<&str>, sort: Sort, latest: bool, out: &Output) -> Result<()> {
    let name_of = |tag: &str| tag.split_once(':').map_or(tag, |(n, _)| n).to_string();
    let mut rows = images::list(store)?;
    if let Some(want) = name {
        // NAME, NAME:VERSION, or a name prefix ending in `*`.
        rows.retain(|r| match want.strip_suffix('*') {
            Some(prefix) => name_of(&r.tag).starts_with(prefix),
            None if want.contains(':') => r.tag == want,
            None => name_of(&r.tag) == want,
        });
        if rows.is_empty() && !want.ends_with('*') {
            let what = if want.contains(':') { ObjectKind::Tag } else { ObjectKind::TagName };
            return Err(StoreError::NotFound { what, key: want.to_string() }.into());
        }
    }
    let newest_first = |a: &images::ImageRow, b: &images::ImageRow| b.created_unix.cmp(&a.created_unix);
    if latest {
        rows.sort_by(|a, b| name_of(&a.tag).cmp(&name_of(&b.tag)).then(newest_first(a, b)));
        rows.dedup_by(|later, first| name_of(&later.tag) == name_of(&first.tag));
    }
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.tag.split_once(':').cmp(&b.tag.split_once(':'))),
        Sort::Time => rows.sort_by_key(|r| std::cmp::Reverse(r.created_unix)),
        Sort::Size => rows.sort_by_key(|r| std::cmp::Reverse(r.logical_bytes)),
    }
    out.emit(&rows, || {
        let width = rows.iter().map(|r| r.tag.len()).max().unwrap_or(3).max(3);
        let mut s =
            format!("{:<width$}  {:<12}  {:<20}  {:>10}  {:>7}  PINNED", "TAG", "IMAGE", "CREATED", "SIZE", "HISTORY");
        for r in &rows {
            let size = r.logical_bytes.map(|b| HumanBytes(b).to_string()).unwrap_or_else(|| "damaged".into());
            let created = r.created.as_deref().unwrap_or("?");
            let line = format!(
                "{:<width$}  {:<12}  {:<20}  {:>10}  {:>7}  {}",
                r.tag,
                r.manifest.get(..12).unwrap_or(""),
                created,
                size,
                r.history,
                if r.pinned { "yes" } else { "" }
            );
            s.push('\n');
            s.push_str(line.trim_end());
            if let Some(e) = &r.error {
                s.push_str(&format!("\n  error: {e}"));
            }
        }
        s
    })
}

/// `gstore show`.
pub(crate) fn show(store: &Store, image: &str, out: &Output) -> Result<()> {
    let info = images::show(store, image)?;
    out.emit(&info, || {
        let mut s = format!(
            "image {image}\nmanifest {}\ncreated {}\nsize {} in {}, {}",
            info.manifest,
            info.created,
            HumanBytes(info.logical_bytes),
            plural(info.entries.len() as u64, "entry", "entries"),
            plural(info.chunks as u64, "chunk", "chunks")
        );
        for (k, v) in &info.meta.to_map() {
            s.push_str(&format!("\nmeta {k} = {v}"));
        }
        s.push_str(&format!("\n{:<7} {:>6} {:>12} {:>8} {:>6}  PATH", "KIND", "MODE", "SIZE", "CHUNKS", "ZERO"));
        for e in &info.entries {
            let kind = format!("{:?}", e.kind).to_lowercase();
            let path = match &e.target {
                Some(t) => format!("{} -> {t}", e.path),
                None => e.path.clone(),
            };
            s.push_str(&format!(
                "\n{kind:<7} {:>6} {:>12} {:>8} {:>6}  {path}",
                e.mode,
                HumanBytes(e.size).to_string(),
                e.chunks,
                e.zero_chunks
            ));
        }
        s
    })
}

/// `gstore log`.
pub(crate) fn log(store: &Store, tag: &str, out: &Output) -> Result<()> {
    let entries = images::log(store, tag)?;
    out.emit(&entries, || {
        let width = entries.iter().map(|e| e.tag.len()).max().unwrap_or(3).max(3);
        let mut s = format!("{:<20}  {:<width$}  {:<12}", "SET", "TAG", "IMAGE");
        for e in &entries {
            let now = if e.current { "  (current)" } else { "" };
            s.push_str(&format!(
                "\n{:<20}  {:<width$}  {:<12}{now}",
                e.set,
                e.tag,
                &e.manifest[..12.min(e.manifest.len())]
            ));
        }
        s
    })
}

/// `gstore diff`.
pub(crate) fn diff(store: &Store, a: &str, b: &str, out: &Output) -> Result<()> {
    let d = images::diff(store, a, b)?;
    out.emit(&d, || {
        let size = |s: Option<u64>| s.map(|b| HumanBytes(b).to_string()).unwrap_or_else(|| "-".into());
        let mut s = format!("{:<8} {:>10} {:>10} {:>14}  PATH", "CHANGE", "SIZE A", "SIZE B", "PLAIN NEW IN B");
        for c in &d.changes {
            s.push_str(&format!(
                "\n{:<8} {:>10} {:>10} {:>14}  {}",
                c.change,
                size(c.size_a),
                size(c.size_b),
                HumanBytes(c.new_bytes).to_string(),
                c.path
            ));
        }
        let n = d.changes.len() as u64;
        s.push_str(&format!(
            "\n{} {}; {b} adds {} to {a}, which holds {} that {b} does not (plain bytes of chunks, \
             before deduplication against the rest of the store and compression: `push` reports \
             the stored bytes it added)",
            plural(n, "path", "paths"),
            if n == 1 { "differs" } else { "differ" },
            HumanBytes(d.only_in_b_bytes),
            HumanBytes(d.only_in_a_bytes)
        ));
        s
    })
}

/// `gstore du`.
pub(crate) fn du(store: &IndexedStore, prefixes: &[String], out: &Output) -> Result<()> {
    let u = usage::usage_by(store, prefixes)?;
    out.emit(&u, || {
        let mut s = format!(
            "logical   {}\nunique    {} (dedup {:.2}x)\nstored    {} (compression {:.2}x)\npacks     {} in {}",
            HumanBytes(u.logical_bytes),
            HumanBytes(u.unique_plain_bytes),
            u.dedup_ratio,
            HumanBytes(u.referenced_stored_bytes),
            u.compression_ratio,
            HumanBytes(u.pack_bytes),
            plural(u.packs as u64, "pack", "packs")
        );
        if u.missing_chunks > 0 {
            s.push_str(&format!("\nwarning: {} referenced chunks are missing: run `gstore verify`", u.missing_chunks));
        }
        let width = u.images.iter().map(|i| i.tag.len()).max().unwrap_or(3).max(3);
        s.push_str(&format!("\n{:<width$}  {:>12} {:>14}", "TAG", "LOGICAL", "UNIQUE STORED"));
        for i in &u.images {
            s.push_str(&format!(
                "\n{:<width$}  {:>12} {:>14}",
                i.tag,
                HumanBytes(i.logical_bytes).to_string(),
                HumanBytes(i.unique_stored_bytes).to_string()
            ));
        }
        if !u.prefixes.is_empty() {
            let width = u.prefixes.iter().map(|p| p.prefix.len() + 2).max().unwrap_or(6).max(6);
            s.push_str(&format!(
                "

{:<width$}  {:>6} {:>12} {:>12} {:>14}",
                "PREFIX", "IMAGES", "LOGICAL", "STORED", "UNIQUE STORED"
            ));
            for p in &u.prefixes {
                s.push_str(&format!(
                    "
{:<width$}  {:>6} {:>12} {:>12} {:>14}",
                    format!("{:?}", p.prefix),
                    p.images,
                    HumanBytes(p.logical_bytes).to_string(),
                    HumanBytes(p.stored_bytes).to_string(),
                    HumanBytes(p.unique_stored_bytes).to_string()
                ));
            }
        }
        s
    })
}

/// `gstore tag`.
pub(crate) fn tag(location: &StoreLocation, source: &str, target: &str, out: &Output) -> Result<()> {
    let rec = images::tag(&open_indexed(location)?, source, target)?;
    out.emit(&rec, || format!("tagged {} -> {}", rec.tag(), rec.manifest))
}

/// `gstore pin` / `gstore unpin`.
pub(crate) fn pin(location: &StoreLocation, tags: &[String], pinned: bool, out: &Output) -> Result<()> {
    let store = Store::open(location)?;
    let tags =
        tags.iter().map(|t| TagRef::parse(t).map_err(StoreError::from)).collect::<gstore_store::Result<Vec<_>>>()?;
    for tag in &tags {
        store.set_pinned(tag, pinned)?;
    }
    let names: Vec<String> = tags.iter().map(ToString::to_string).collect();
    let word = if pinned { "pinned" } else { "unpinned" };
    out.emit(&serde_json::json!({ word: names }), || {
        names.iter().map(|t| format!("{word} {t}")).collect::<Vec<_>>().join("\n")
    })
}

/// `gstore rm`: every tag named, each checked before any is removed.
pub(crate) fn rm(location: &StoreLocation, images: &[String], out: &Output) -> Result<()> {
    let names: Vec<&str> = images.iter().map(String::as_str).collect();
    let tags = images::remove_tags(&Store::open(location)?, &names)?;
    let removed: Vec<String> = tags.iter().map(|t| t.tag.to_string()).collect();
    let pinned: Vec<String> = tags.iter().filter(|t| t.pinned).map(|t| t.tag.to_string()).collect();
    for t in &pinned {
        eprintln!("gstore: warning: {t} was pinned; its pin went with it (retention no longer keeps its image)");
    }
    out.emit(&serde_json::json!({ "removed": removed, "pinned": pinned }), || {
        removed.iter().map(|t| format!("removed tag {t}")).collect::<Vec<_>>().join("\n")
            + "\n(space is reclaimed by gc)"
    })
}

/// `gstore copy`.
pub(crate) fn copy(location: &StoreLocation, images: &[String], to: &str, out: &Output, bars: &Bars) -> Result<()> {
    let target = StoreLocation::parse(to)?;
    if target == *location {
        return Err(Usage(format!("--to {to} is the store the images are in")).into());
    }
    let tags =
        images.iter().map(|i| TagRef::parse(i).map_err(StoreError::from)).collect::<gstore_store::Result<Vec<_>>>()?;
    let src = open_indexed(location)?;
    for t in &tags {
        src.resolve(&t.to_string())?;
    }
    // Opening a plain target with the source's key set would say to unset it: say what copy
    // says of two stores that name chunks differently instead.
    if src.config().encryption.is_some() {
        let plain_target =
            target.backend().and_then(|b| Store::read_config(&b, &target)).is_ok_and(|c| c.encryption.is_none());
        if plain_target {
            return Err(Usage(format!(
                "{} is encrypted and {to} is not: they name chunks differently, so images are not copied between them; restore the image and push it",
                location.describe()
            ))
            .into());
        }
    }
    let dst = open_indexed(&target).with_context(|| format!("opening the target store {to}"))?;
    let mut reports = Vec::new();
    for t in &tags {
        reports.push(
            gstore_store::commands::copy::copy(&src, &dst, t, bars).with_context(|| format!("copy of {t} failed"))?,
        );
    }
    out.emit(&reports, || {
        reports
            .iter()
            .map(|r| {
                format!(
                    "copied {} to {} ({} of {} chunks sent, {} in {}, {})",
                    r.tag,
                    dst.describe(),
                    r.copied_chunks,
                    r.chunks,
                    HumanBytes(r.copied_stored_bytes),
                    plural(r.packs, "pack", "packs"),
                    rate(r.copied_stored_bytes, r.seconds)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}
