//! Files in and out of the store: `gstore push`, `gstore restore --to DIR`, `gstore cat`.

use crate::containers;
use crate::failure::Usage;
use crate::output::{plural, push_summary, rate, Output};
use crate::stores::{open_image, open_indexed};
use anyhow::{Context, Result};
use gstore_progress::Bars;
use gstore_store::format::meta::ImageMeta;
use gstore_store::{commands::push, StoreLocation, TagRef};
use indicatif::HumanBytes;
use std::collections::BTreeMap;

/// `gstore push`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn push(
    location: &StoreLocation,
    path: &std::path::Path,
    tag: &str,
    meta: &[String],
    select: &Selection,
    dry_run: bool,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let tag = TagRef::parse_new(tag)?;
    let meta = parse_meta(meta)?;
    if path.as_os_str() == "-" || (path.is_file() && gstore_container::archive::is_checkpoint_archive(path)) {
        if dry_run || !select.is_everything() {
            return Err(
                Usage("an archive is pushed whole: --dry-run and --exclude take a directory or a file".into()).into()
            );
        }
        return containers::push_archive(location, path, &tag, meta, out, bars);
    }
    if let Err(e) = path.symlink_metadata() {
        return Err(Usage(format!("cannot push {}: {e}", path.display())).into());
    }
    let store = open_indexed(location)?;
    let r = push::push_selected(&store, path, &|rel| select.chosen(rel), dry_run, &tag, meta, bars)
        .with_context(|| format!("push of {} failed", path.display()))?;
    let verb = if r.dry_run { "would push" } else { "pushed" };
    out.emit(&r, || push_summary(verb, &path.display().to_string(), &r))
}

/// `gstore restore --to DIR`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_to(
    location: &StoreLocation,
    image: &str,
    to: &std::path::Path,
    select: &Selection,
    seeds: &[std::path::PathBuf],
    memory_budget: u64,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let (store, id, m) = open_image(location, image)?;
    let m = select.apply(m)?;
    let seed = if seeds.is_empty() {
        None
    } else {
        Some(gstore_restore::seed::Seed::index(seeds, store.config(), &store.chunk_ids(), bars)?)
    };
    let r = gstore_restore::restore_to_dir_seeded(
        &store,
        &id,
        &m,
        to,
        gstore_restore::Budget::of(memory_budget),
        seed.as_ref(),
        bars,
    )
    .with_context(|| format!("restore of {image} failed"))?;
    out.emit(&r, || {
        let resumed = if r.resumed_chunks > 0 {
            format!(", resumed: {} chunks were already in place", r.resumed_chunks)
        } else {
            String::new()
        };
        let seeded = match &seed {
            Some(s) => format!(
                ", {} of it copied from the seed ({} indexed), {} fetched",
                HumanBytes(r.seeded_bytes),
                HumanBytes(s.indexed_bytes()),
                HumanBytes(r.fetched_bytes)
            ),
            None => String::new(),
        };
        format!(
            "restored {image} into {} ({}, {}, {}{resumed}{seeded})",
            r.destination,
            plural(r.entries as u64, "entry", "entries"),
            HumanBytes(r.logical_bytes),
            rate(r.logical_bytes, r.seconds)
        )
    })
}

/// `gstore cat`: the file's bytes on stdout.
pub(crate) fn cat(location: &StoreLocation, image: &str, path: &str) -> Result<()> {
    let (store, _, m) = open_image(location, image)?;
    let mut stdout = std::io::stdout().lock();
    gstore_restore::cat::write_file(&store, &m, path, &mut stdout)?;
    Ok(())
}

/// What `restore --include / --exclude` keep.
pub(crate) struct Selection {
    include: Option<globset::GlobSet>,
    exclude: Option<globset::GlobSet>,
}

impl Selection {
    pub(crate) fn new(include: &[String], exclude: &[String]) -> Result<Selection> {
        let set = |patterns: &[String], flag: &str| -> Result<Option<globset::GlobSet>> {
            if patterns.is_empty() {
                return Ok(None);
            }
            let mut b = globset::GlobSetBuilder::new();
            for p in patterns {
                let glob = globset::GlobBuilder::new(p.trim_end_matches('/'))
                    .literal_separator(true)
                    .build()
                    .map_err(|e| Usage(format!("{flag} {p:?}: {e}")))?;
                b.add(glob);
            }
            Ok(Some(b.build().map_err(|e| Usage(format!("{flag}: {e}")))?))
        };
        Ok(Selection { include: set(include, "--include")?, exclude: set(exclude, "--exclude")? })
    }

    /// Whether `path` or a directory above it matches `set`.
    fn matches(set: &globset::GlobSet, path: &str) -> bool {
        let mut p = path;
        loop {
            if set.is_match(p) {
                return true;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => return false,
            }
        }
    }

    /// Whether every entry is selected (no --include, no --exclude).
    fn is_everything(&self) -> bool {
        self.include.is_none() && self.exclude.is_none()
    }

    /// Whether `path` is selected: included (or no --include), and not excluded.
    fn chosen(&self, path: &str) -> bool {
        self.include.as_ref().is_none_or(|s| Self::matches(s, path))
            && !self.exclude.as_ref().is_some_and(|s| Self::matches(s, path))
    }

    /// The image with only the selected entries and the directories above them.
    fn apply(&self, m: gstore_store::format::manifest::Manifest) -> Result<gstore_store::format::manifest::Manifest> {
        if self.is_everything() {
            return Ok(m);
        }
        let chosen = |path: &str| self.chosen(path);
        let mut keep: std::collections::HashSet<&str> =
            m.entries.iter().filter(|e| chosen(&e.path)).map(|e| e.path.as_str()).collect();
        if keep.is_empty() {
            return Err(
                Usage("--include / --exclude select no entry of the image (`gstore show` lists them)".into()).into()
            );
        }
        let parents: Vec<&str> = keep.iter().flat_map(|p| p.match_indices('/').map(move |(i, _)| &p[..i])).collect();
        keep.extend(parents);
        let keep: std::collections::HashSet<String> = keep.into_iter().map(str::to_string).collect();
        Ok(m.subset(|e| keep.contains(&e.path)))
    }
}

/// The metadata `--meta KEY=VALUE` items give (every value a string).
pub(crate) fn parse_meta(items: &[String]) -> Result<ImageMeta> {
    let mut meta = BTreeMap::new();
    for item in items {
        let Some((k, v)) = item.split_once('=') else {
            return Err(Usage(format!("--meta {item:?}: expected KEY=VALUE")).into());
        };
        meta.insert(k.to_string(), serde_json::Value::String(v.to_string()));
    }
    Ok(ImageMeta::from_map(meta))
}
